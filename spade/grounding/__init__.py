"""Grounding: documents from a corpus for the designer's prompts.

`build_corpus(config.grounding, process_index=, process_count=)` gives a
`Corpus` whose `sample(n)` returns `Document(id, title, text, source)`s,
deterministically from a cursor that `state()`/`restore()` save and resume.
Sources: a built-in offline corpus (Python's own documentation), JSONL and
text files, TFDS datasets and seqio tasks (the last two need `spade[data]`).
"""

from spade.grounding.corpus import build_corpus
from spade.grounding.corpus import clean_text
from spade.grounding.corpus import Corpus
from spade.grounding.corpus import truncate_words
from spade.grounding.document import Document
from spade.grounding.document import SourceError

__all__ = [
    "Corpus",
    "Document",
    "SourceError",
    "build_corpus",
    "clean_text",
    "truncate_words",
]
