"""The grounding corpus: cleaned, truncated, sharded, sampled with a cursor.

`build_corpus(config.grounding, process_index=, process_count=)` reads the
configured source, cleans every document (Unicode NFC, control characters
removed, line ends and blank-line runs normalised), truncates it to
`max_words` whitespace-separated words (the reference's budget: 6,000 words
for games, 4,000 for tool use; 0 keeps everything) and keeps this process's
shard: local sources are read whole and strided (`docs[i::count]`), TFDS and
seqio read their shard directly.

Sampling is deterministic and resumable. The cursor is one integer, the number
of documents drawn so far; document `k` of the stream is position
`k % len(shard)` of epoch `k // len(shard)`, and each epoch's order is the
shard sorted by a hash of (seed, epoch, document id). So the order is fixed by
the seed and the ids alone, with no generator whose stream could change
between library versions, and every document is seen once per epoch. All
processes draw the same number of documents per call, so the cursor, and so
`state()`, is identical on every process and can live in the shared
checkpoint.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

from spade.grounding import document
from spade.grounding import sources

Document = document.Document

STATE_VERSION = 1

# C0/C1 control characters except tab and newline; they confuse tokenizers
# and terminals and carry nothing a designer can use.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_BLANK_RUNS = re.compile(r"\n{3,}")
_WORD = re.compile(r"\S+")


def clean_text(text: str) -> str:
  """Normalises a document's text.

  Unicode NFC; CRLF and CR become LF; tabs become spaces; control characters
  and zero-width characters are removed; trailing spaces are stripped from
  each line; runs of blank lines collapse to one; the result is stripped.
  Indentation inside lines is kept, since documents may hold code.

  Args:
    text: raw text.

  Returns:
    The cleaned text ("" if nothing printable is left).
  """
  text = unicodedata.normalize("NFC", text)
  text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\t", "    ")
  text = _CONTROL.sub("", text)
  text = text.replace("\u200b", "").replace("\ufeff", "")
  text = "\n".join(line.rstrip() for line in text.split("\n"))
  return _BLANK_RUNS.sub("\n\n", text).strip()


def truncate_words(text: str, max_words: int) -> str:
  """Keeps the first `max_words` words of `text`, with its layout.

  A truncated document ends with a line saying so, as in the reference, so the
  designer knows the text was cut.

  Args:
    text: cleaned text.
    max_words: the budget; 0 (or less) keeps everything.

  Returns:
    The text, or its first `max_words` words plus a truncation note.
  """
  if max_words <= 0:
    return text
  end = None
  for i, match in enumerate(_WORD.finditer(text)):
    if i == max_words - 1:
      end = match.end()
    elif i == max_words:
      return text[:end] + f"\n[Document truncated at {max_words} words]"
  return text


TEXT_RULES = ("reference", "layout")


def reference_text(text: str, max_words: int) -> str:
  """The reference's document (`Corpus._truncate`, `spade/core/corpus.py`):
  the text stripped; over `max_words` whitespace-separated words, its first
  `max_words` joined by single spaces and the note
  "[Document truncated at ~N words]" on a line of its own."""
  text = text.strip()
  words = text.split()
  if max_words <= 0 or len(words) <= max_words:
    return text
  cut = " ".join(words[:max_words])
  return cut + f"\n[Document truncated at ~{max_words} words]"


def _order_key(seed: int, epoch: int, process_index: int, doc_id: str):
  h = hashlib.sha256(f"{seed}/{epoch}/{process_index}/{doc_id}".encode())
  return h.digest()


class Corpus:
  """This process's shard of cleaned documents, sampled with a cursor.

  With grounding disabled the corpus is empty and `sample(n)` returns [], so
  prompts are built without documents (the paper's no-corpus ablation).
  """

  def __init__(
      self,
      documents: list[Document],
      *,
      source: str,
      seed: int = 0,
      process_index: int = 0,
      enabled: bool = True,
  ):
    """Wraps prepared documents; most callers want `build_corpus`.

    Args:
      documents: this process's cleaned, truncated documents, unique ids.
      source: the source kind, recorded in `state()` and checked on restore.
      seed: the sampling seed.
      process_index: this process (its epochs' orders differ from others').
      enabled: False for a corpus that yields nothing.
    """
    if enabled and not documents:
      raise document.SourceError(
          f"grounding source {source!r} yielded no documents for process "
          f"{process_index}"
      )
    sources.iter_ids(documents)
    self._docs = list(documents)
    self._by_id = {d.id: d for d in self._docs}
    self.source = source
    self.enabled = enabled
    self._seed = int(seed)
    self._process_index = process_index
    self._drawn = 0
    self._epoch_cache: tuple[int, list[int]] | None = None

  def __len__(self) -> int:
    return len(self._docs)

  @property
  def documents(self) -> list[Document]:
    """This process's documents, in source order."""
    return list(self._docs)

  def get(self, doc_id: str) -> Document:
    """Returns the document with this id (KeyError if not in this shard)."""
    return self._by_id[doc_id]

  def _epoch_order(self, epoch: int) -> list[int]:
    if self._epoch_cache is None or self._epoch_cache[0] != epoch:
      order = sorted(
          range(len(self._docs)),
          key=lambda i: _order_key(
              self._seed, epoch, self._process_index, self._docs[i].id
          ),
      )
      self._epoch_cache = (epoch, order)
    return self._epoch_cache[1]

  def sample(self, n: int) -> list[Document]:
    """Returns the next `n` documents of the stream and advances the cursor.

    Args:
      n: how many; more than the shard's size wraps into the next epoch.

    Returns:
      `n` documents ([] when grounding is disabled).
    """
    if n < 0:
      raise ValueError(f"Corpus.sample(n={n}): n must be >= 0")
    if not self.enabled:
      return []
    out = []
    size = len(self._docs)
    for k in range(self._drawn, self._drawn + n):
      epoch, pos = divmod(k, size)
      out.append(self._docs[self._epoch_order(epoch)[pos]])
    self._drawn += n
    return out

  def state(self) -> dict:
    """The cursor, JSON-able and identical on every process."""
    return {
        "version": STATE_VERSION,
        "source": self.source,
        "seed": self._seed,
        "drawn": self._drawn,
    }

  def restore(self, state: dict) -> None:
    """Resumes the stream where `state()` left it.

    The state's seed replaces the configured one, so a resumed run continues
    the same order even if `config.grounding.seed` was changed.

    Args:
      state: a dict from `state()`.

    Raises:
      ValueError: the state is from another source kind or a newer version.
    """
    if state.get("version") != STATE_VERSION:
      raise ValueError(
          f"corpus state version {state.get('version')!r} is not "
          f"{STATE_VERSION}; it was saved by another SPADE version"
      )
    if state["source"] != self.source:
      raise ValueError(
          f"the checkpoint's corpus cursor is for source {state['source']!r} "
          f"but config.grounding.source={self.source!r}; restore with the "
          "same source or start a new workdir"
      )
    self._seed = int(state["seed"])
    self._drawn = int(state["drawn"])
    self._epoch_cache = None


def prepare(
    documents: list[Document], max_words: int, rule: str = "reference"
) -> list[Document]:
  """Truncates documents, dropping those left empty: `rule` "reference"
  (`reference_text`) or "layout" (ours: `clean_text`, then
  `truncate_words`, which keeps the text's lines)."""
  if rule not in TEXT_RULES:
    raise ValueError(
        f"config.grounding.text_rule={rule!r} is not one of {TEXT_RULES}"
    )
  out = []
  for d in documents:
    if rule == "reference":
      text = reference_text(d.text, max_words)
    else:
      text = truncate_words(clean_text(d.text), max_words)
    if text:
      out.append(
          Document(
              id=d.id,
              title=clean_text(d.title).replace("\n", " "),
              text=text,
              source=d.source,
          )
      )
  return out


def build_corpus(
    grounding_config, *, process_index: int = 0, process_count: int = 1
) -> Corpus:
  """Builds this process's corpus from `config.grounding`.

  Args:
    grounding_config: the `grounding` section of the config.
    process_index: this process (`jax.process_index()`).
    process_count: all processes (`jax.process_count()`).

  Returns:
    The corpus; empty and yielding nothing when grounding is disabled.

  Raises:
    SourceError: the source is missing, empty or malformed (the message names
      the file or dataset).
  """
  c = grounding_config
  if not 0 <= process_index < process_count:
    raise ValueError(
        f"process_index={process_index} must be in [0, {process_count})"
    )
  if not c.enabled:
    return Corpus([], source=c.source, seed=c.seed, enabled=False)
  docs, sharded = sources.read_source(c, process_index, process_count)
  docs = prepare(docs, c.max_words, c.get("text_rule", "reference"))
  if not sharded:
    sources.iter_ids(docs)  # check uniqueness over the whole source
    if len(docs) < process_count:
      raise document.SourceError(
          f"grounding source {c.source!r} has {len(docs)} documents, fewer "
          f"than the {process_count} processes that each need a shard"
      )
    docs = docs[process_index::process_count]
    if c.max_documents:
      docs = docs[: c.max_documents]
  return Corpus(docs, source=c.source, seed=c.seed, process_index=process_index)
