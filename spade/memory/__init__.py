"""Memory: the archive of environments, near-duplicates and replay.

`Archive(config.memory)` records every program the designer writes (code,
description, verdict, stats, lineage), rejects near-duplicates before they
enter, picks examples for the designer's prompts, and replays past
environments with PLR's prioritisation. `python -m spade.memory.show WORKDIR`
prints a run's archive.
"""

from spade.memory.archive import Archive
from spade.memory.archive import Entry
from spade.memory.archive import Lineage
from spade.memory.archive import MEMORY_FILE
from spade.memory.archive import Stats

__all__ = ["Archive", "Entry", "Lineage", "MEMORY_FILE", "Stats"]
