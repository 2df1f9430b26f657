"""Document sources for grounding the designer, behind one interface.

Every reader returns raw `Document`s in a fixed order (cleaning, truncation,
sharding of local sources and sampling are `corpus.py`'s job):

  builtin  the offline corpus shipped with Python itself (`builtin.py`)
  jsonl    one JSON object a line with a "text" (or the reference's
           "orig_doc") field; a file, a directory of *.jsonl[.gz], or a glob
  text     .txt/.md files: a file, a directory (recursive), or a glob
  tfds     a prepared TFDS dataset by name and `data_dir` (`[data]` extra)
  seqio    a registered seqio task or mixture by name (`[data]` extra); the
           raw documents of its source, before preprocessing, since the
           designer needs text and preprocessors usually tokenize

TFDS and seqio read only this process's shard (they can be large); the local
sources are read whole and sharded by the corpus. A missing file, directory or
dataset raises `SourceError` naming it and saying what to do.
"""

from __future__ import annotations

import glob as glob_lib
import gzip
import importlib
import json
import os
from typing import Any, Iterable

from spade.grounding import builtin
from spade.grounding import document


def _expand(path: str, suffixes: tuple[str, ...], kind: str) -> list[str]:
  """Returns the sorted files a path, directory or glob names."""
  if not path:
    raise document.SourceError(
        f"config.grounding.path is empty but source={kind!r} needs it: set "
        f"--config.grounding.path to a file, directory or glob"
    )
  files = []
  for part in path.split(","):
    part = os.path.expanduser(part.strip())
    if os.path.isdir(part):
      for root, dirs, names in os.walk(part):
        dirs.sort()  # os.walk order is the file system's; sort for stability
        files.extend(
            os.path.join(root, n) for n in sorted(names) if n.endswith(suffixes)
        )
    elif os.path.isfile(part):
      files.append(part)
    elif glob_lib.has_magic(part):
      matched = sorted(glob_lib.glob(part, recursive=True))
      if not matched:
        raise document.SourceError(
            f"grounding {kind} glob {part!r} matches no file"
        )
      files.extend(f for f in matched if os.path.isfile(f))
    else:
      raise document.SourceError(
          f"grounding {kind} file {part!r} does not exist: check "
          "config.grounding.path"
      )
  if not files:
    raise document.SourceError(
        f"grounding {kind} path {path!r} holds no file ending in {suffixes}"
    )
  return files


def _open_text(path: str):
  if path.endswith(".gz"):
    return gzip.open(path, "rt", encoding="utf-8")
  return open(path, encoding="utf-8")


def read_jsonl(path: str, text_key: str = "text", title_key: str = "title"):
  """Reads JSONL documents: one object a line with a text field.

  The reference implementation's corpus format: `{"text": ...}` (or its SPICE
  form `{"orig_doc": ...}`); other fields are ignored except `title_key` and
  "id". Blank lines are skipped; a line that is not JSON is an error naming
  the file and line, since a corrupt corpus should not shrink silently.

  Args:
    path: a .jsonl/.jsonl.gz file, a directory of them, a glob, or several of
      these separated by commas.
    text_key: the field that holds the text.
    title_key: the field that holds the title, if any.

  Returns:
    The documents, in file then line order.
  """
  docs = []
  for file in _expand(path, (".jsonl", ".jsonl.gz"), "jsonl"):
    name = os.path.basename(file)
    with _open_text(file) as f:
      for line_no, line in enumerate(f, 1):
        line = line.strip()
        if not line:
          continue
        try:
          obj = json.loads(line)
        except json.JSONDecodeError as e:
          raise document.SourceError(
              f"{file}:{line_no} is not valid JSON ({e.msg}); fix or remove "
              "the line"
          ) from e
        if not isinstance(obj, dict):
          raise document.SourceError(f"{file}:{line_no} is not a JSON object")
        text = obj.get(text_key)
        if text is None:
          text = obj.get("orig_doc")
        if text is None:
          raise document.SourceError(
              f"{file}:{line_no} has no {text_key!r} (or 'orig_doc') field; "
              "set config.grounding.text_key to the field holding the text"
          )
        doc_id = obj.get("id", f"{name}:{line_no}")
        docs.append(
            document.Document(
                id=str(doc_id),
                title=str(obj.get(title_key) or ""),
                text=str(text),
                source="jsonl",
            )
        )
  return docs


def read_text(path: str):
  """Reads .txt and .md files, one document per file.

  The title is the first Markdown heading (or the first line) of the file; the
  id is the path relative to the directory given (or the file name).

  Args:
    path: a file, a directory (searched recursively), a glob, or several of
      these separated by commas.

  Returns:
    The documents, in sorted path order.
  """
  docs = []
  for part in path.split(",") if path else [""]:
    base = part.strip()
    root = base if os.path.isdir(base) else os.path.dirname(base)
    for file in _expand(base, (".txt", ".md"), "text"):
      with _open_text(file) as f:
        text = f.read()
      first = next((l for l in text.splitlines() if l.strip()), "")
      title = first.lstrip("#").strip() if first else ""
      if not title:
        title = os.path.splitext(os.path.basename(file))[0]
      docs.append(
          document.Document(
              id=os.path.relpath(file, root or "."),
              title=title[:200],
              text=text,
              source="text",
          )
      )
  return docs


def _decode(value: Any) -> str:
  if isinstance(value, bytes):
    return value.decode("utf-8", errors="replace")
  if hasattr(value, "item"):  # numpy scalar holding bytes
    return _decode(value.item())
  return str(value)


def _require(module: str, source: str):
  try:
    return importlib.import_module(module)
  except ImportError as e:
    raise document.SourceError(
        f"grounding source {source!r} needs {module}: pip install "
        "'spade[data]' (tensorflow-datasets and seqio)"
    ) from e


def _text_and_title(example: dict, text_key: str, title_key: str, where: str):
  if text_key not in example:
    raise document.SourceError(
        f"{where} examples have no {text_key!r} feature (they have "
        f"{sorted(example)}); set config.grounding.text_key"
    )
  title = example.get(title_key, "")
  return _decode(example[text_key]), _decode(title) if title != "" else ""


def read_tfds(
    name: str,
    data_dir: str = "",
    split: str = "train",
    text_key: str = "text",
    title_key: str = "title",
    process_index: int = 0,
    process_count: int = 1,
    max_documents: int = 0,
):
  """Reads this process's even shard of a prepared TFDS dataset.

  Nothing is downloaded (training hosts are often offline): the dataset must
  be prepared under `data_dir` (`tfds build NAME --data_dir=...`).

  Args:
    name: the dataset name, optionally with config and version
      ("wikipedia/20230601.en").
    data_dir: where it is prepared; "" for TFDS's default.
    split: the split to read.
    text_key: the feature holding the text.
    title_key: the feature holding the title, if any.
    process_index: this process.
    process_count: how many processes share the dataset.
    max_documents: stop after this many documents of the shard (0: all).

  Returns:
    The shard's documents, in dataset order; ids are "NAME/SPLIT/p/i" (p:
    the process, i: the position in its shard).
  """
  if not name:
    raise document.SourceError(
        "config.grounding.name is empty but source='tfds' needs a dataset "
        "name, e.g. --config.grounding.name=wikipedia/20230601.en"
    )
  tfds = _require("tensorflow_datasets", "tfds")
  try:
    builder = tfds.builder(name, data_dir=data_dir or None)
  except Exception as e:  # tfds raises several types for an unknown name
    raise document.SourceError(
        f"TFDS dataset {name!r} not found (data_dir={data_dir!r}): "
        f"{str(e).splitlines()[0]}"
    ) from e
  if not builder.is_prepared():
    raise document.SourceError(
        f"TFDS dataset {name!r} is not prepared under {builder.data_dir!r}: "
        f"run `tfds build {name} --data_dir=DIR` and set "
        "config.grounding.path to DIR"
    )
  if split not in builder.info.splits:
    raise document.SourceError(
        f"TFDS dataset {name!r} has no split {split!r} (it has "
        f"{sorted(builder.info.splits)}); set config.grounding.split"
    )
  shard = tfds.even_splits(split, n=process_count, drop_remainder=False)[
      process_index
  ]
  ds = builder.as_dataset(split=shard, shuffle_files=False)
  if max_documents:
    ds = ds.take(max_documents)
  docs = []
  for i, ex in enumerate(tfds.as_numpy(ds)):
    text, title = _text_and_title(ex, text_key, title_key, f"TFDS {name!r}")
    docs.append(
        document.Document(
            id=f"{name}/{split}/{process_index}/{i}",
            title=title,
            text=text,
            source="tfds",
        )
    )
  return docs


def read_seqio(
    name: str,
    module: str = "",
    split: str = "train",
    text_key: str = "text",
    title_key: str = "title",
    process_index: int = 0,
    process_count: int = 1,
    max_documents: int = 0,
):
  """Reads this process's shard of a seqio task's (or mixture's) source.

  Args:
    name: the registered task or mixture.
    module: a Python module to import first so that it registers the task
      (seqio registries are filled by imports); "" if already registered.
    split: the split to read.
    text_key: the source's feature holding the text.
    title_key: the feature holding the title, if any.
    process_index: this process.
    process_count: how many processes share the task.
    max_documents: stop after this many documents of the shard (0: all).

  Returns:
    The shard's documents, in source order; ids are "NAME/SPLIT/p/i".
  """
  if not name:
    raise document.SourceError(
        "config.grounding.name is empty but source='seqio' needs a task name"
    )
  seqio = _require("seqio", "seqio")
  if module:
    try:
      importlib.import_module(module)
    except ImportError as e:
      raise document.SourceError(
          f"config.grounding.module={module!r} could not be imported to "
          f"register seqio task {name!r}: {e}"
      ) from e
  try:
    task = seqio.get_mixture_or_task(name)
  except ValueError as e:
    raise document.SourceError(
        f"seqio task or mixture {name!r} is not registered; set "
        "config.grounding.module to the module that registers it"
    ) from e
  tasks = task.tasks if isinstance(task, seqio.Mixture) else [task]
  docs = []
  for t in tasks:
    source = t.source
    if split not in source.splits:
      raise document.SourceError(
          f"seqio task {t.name!r} has no split {split!r} (it has "
          f"{list(source.splits)}); set config.grounding.split"
      )
    if source.supports_arbitrary_sharding:
      ds = source.get_dataset(
          split=split,
          shuffle=False,
          shard_info=seqio.ShardInfo(process_index, process_count),
      )
    else:
      ds = source.get_dataset(split=split, shuffle=False)
      ds = ds.shard(process_count, process_index)
    if max_documents:
      ds = ds.take(max_documents)
    for i, ex in enumerate(ds.as_numpy_iterator()):
      text, title = _text_and_title(
          ex, text_key, title_key, f"seqio task {t.name!r}"
      )
      docs.append(
          document.Document(
              id=f"{t.name}/{split}/{process_index}/{i}",
              title=title,
              text=text,
              source="seqio",
          )
      )
  return docs


def read_source(
    grounding_config, process_index: int = 0, process_count: int = 1
) -> tuple[list[document.Document], bool]:
  """Reads the configured source.

  Args:
    grounding_config: `config.grounding`.
    process_index: this process.
    process_count: the number of processes.

  Returns:
    (documents, sharded): `sharded` is True when the reader already kept only
    this process's shard (TFDS, seqio).
  """
  c = grounding_config
  kind = c.source
  if kind == "builtin":
    return builtin.documents(), False
  if kind == "jsonl":
    return read_jsonl(c.path, c.text_key, c.title_key), False
  if kind == "text":
    return read_text(c.path), False
  if kind == "tfds":
    return (
        read_tfds(
            c.name,
            c.path,
            c.split,
            c.text_key,
            c.title_key,
            process_index,
            process_count,
            c.max_documents,
        ),
        True,
    )
  if kind == "seqio":
    return (
        read_seqio(
            c.name,
            c.module,
            c.split,
            c.text_key,
            c.title_key,
            process_index,
            process_count,
            c.max_documents,
        ),
        True,
    )
  raise document.SourceError(
      f"config.grounding.source={kind!r} is not one of builtin, jsonl, text, "
      "tfds, seqio"
  )


def iter_ids(docs: Iterable[document.Document]) -> list[str]:
  """Returns the ids of `docs`, checking that they are unique."""
  ids, seen = [], set()
  for d in docs:
    if d.id in seen:
      raise document.SourceError(
          f"grounding document id {d.id!r} appears twice; ids must be unique "
          "within a source (give each JSONL line a distinct 'id' or none)"
      )
    seen.add(d.id)
    ids.append(d.id)
  return ids
