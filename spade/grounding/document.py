"""The grounding document, and the error every grounding source raises."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Document:
  """One grounding document.

  Attributes:
    id: stable identifier, unique within its source (memory uses it to find an
      environment's grounding neighbours).
    title: a short human-readable title ("" when the source has none).
    text: the document's text.
    source: the source kind that produced it ("builtin", "jsonl", ...).
  """

  id: str
  title: str
  text: str
  source: str


class SourceError(ValueError):
  """A grounding source that cannot be read; the message names it."""
