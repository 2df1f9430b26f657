"""The built-in offline corpus: Python's own documentation.

Why this corpus: it ships with every Python installation (nothing to download,
so a run on an offline host or in CI is grounded out of the box), it is real
prose written by people to explain real systems, and its subjects (scheduling,
heaps, calendars, fractions, statistics, parsers, protocols, turtle games,
the Towers of Hanoi, Nim) are good seeds for games and tool-use environments.
Its licence (PSF) allows redistribution.

Two parts, both read without importing the modules they describe (so no
module's import side effects run, and `python -OO` cannot strip them):

  * the Python Language Reference topics that `help()` shows, from
    `pydoc_data.topics` (79 documents, about 65,000 words);
  * the documentation of a fixed list of pure-Python standard library
    modules: the module docstring plus the docstrings of its public classes,
    methods and functions, parsed from the module's source with `ast`.

The text depends on the Python version (documents change between releases);
ids ("python-docs:topic/for", "python-docs:module/heapq") do not.
"""

from __future__ import annotations

import ast
import functools
import importlib.util

from spade.grounding import document

# Pure-Python modules whose documentation is substantial and whose subjects
# suit environments (games, puzzles, protocols, data formats, numerics).
# Sorted, so the corpus order is fixed; missing ones are skipped (a distro may
# leave out turtledemo or tkinter-dependent modules).
MODULES = (
    "argparse",
    "ast",
    "base64",
    "bisect",
    "calendar",
    "cmd",
    "collections",
    "colorsys",
    "configparser",
    "contextlib",
    "copy",
    "csv",
    "dataclasses",
    "datetime",
    "dbm",
    "difflib",
    "doctest",
    "enum",
    "filecmp",
    "fnmatch",
    "fractions",
    "ftplib",
    "functools",
    "getopt",
    "glob",
    "graphlib",
    "gzip",
    "heapq",
    "hmac",
    "http.cookies",
    "imaplib",
    "inspect",
    "ipaddress",
    "json",
    "locale",
    "logging",
    "lzma",
    "mimetypes",
    "numbers",
    "operator",
    "optparse",
    "pathlib",
    "plistlib",
    "poplib",
    "pprint",
    "queue",
    "quopri",
    "random",
    "sched",
    "secrets",
    "shelve",
    "shutil",
    "smtplib",
    "socketserver",
    "statistics",
    "string",
    "tabnanny",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "timeit",
    "tokenize",
    "turtle",
    "turtledemo.lindenmayer",
    "turtledemo.minimal_hanoi",
    "turtledemo.nim",
    "turtledemo.paint",
    "turtledemo.penrose",
    "turtledemo.round_dance",
    "turtledemo.sorting_animate",
    "urllib.parse",
    "uuid",
    "wave",
    "weakref",
    "xml.etree.ElementTree",
    "zipfile",
)

# Documents shorter than this are headings, not text worth grounding on.
_MIN_WORDS = 40


def _module_text(tree: ast.Module) -> str:
  """Module docstring, then each public class/function (and method) doc."""
  parts = [ast.get_docstring(tree) or ""]
  for node in tree.body:
    if not isinstance(
        node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    ):
      continue
    if node.name.startswith("_"):
      continue
    doc = ast.get_docstring(node)
    if doc:
      kind = "class" if isinstance(node, ast.ClassDef) else "function"
      parts.append(f"{kind} {node.name}: {doc}")
    if isinstance(node, ast.ClassDef):
      for sub in node.body:
        if isinstance(
            sub, (ast.FunctionDef, ast.AsyncFunctionDef)
        ) and not sub.name.startswith("_"):
          sub_doc = ast.get_docstring(sub)
          if sub_doc:
            parts.append(f"{node.name}.{sub.name}: {sub_doc}")
  return "\n\n".join(p for p in parts if p)


def _module_documents() -> list[document.Document]:
  docs = []
  for name in MODULES:
    try:
      spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
      continue
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
      continue
    with open(spec.origin, encoding="utf-8") as f:
      tree = ast.parse(f.read(), filename=spec.origin)
    text = _module_text(tree)
    if len(text.split()) < _MIN_WORDS:
      continue
    first = text.strip().splitlines()[0].strip()
    docs.append(
        document.Document(
            id=f"python-docs:module/{name}",
            title=f"{name}: {first}"[:200],
            text=text,
            source="builtin",
        )
    )
  return docs


def _topic_documents() -> list[document.Document]:
  try:
    from pydoc_data import topics  # pylint: disable=g-import-not-at-top
  except ImportError:
    return []  # some distros split pydoc_data out; the modules remain
  docs = []
  for key in sorted(topics.topics):
    text = topics.topics[key]
    if len(text.split()) < _MIN_WORDS:
      continue
    first = text.strip().splitlines()[0].strip()
    docs.append(
        document.Document(
            id=f"python-docs:topic/{key}",
            title=first[:200],
            text=text,
            source="builtin",
        )
    )
  return docs


@functools.cache
def _all_documents() -> tuple[document.Document, ...]:
  return tuple(_topic_documents() + _module_documents())


def documents() -> list[document.Document]:
  """Returns the built-in corpus: language reference topics, then modules.

  Raises:
    SourceError: if this Python installation carries none of it.
  """
  docs = list(_all_documents())
  if not docs:
    raise document.SourceError(
        "the built-in grounding corpus is empty: this Python has neither "
        "pydoc_data nor the standard library sources; use "
        "--config.grounding.source=jsonl with a corpus file"
    )
  return docs
