"""The loop state: grounding cursor, memory archive (with its replay
buffer), the delayed designer rows and the regeneration window.

All of it is plain host-side state, identical on every process (every process
makes the same calls in the same order), saved whole as one JSON item in the
checkpoint (so a resume continues exactly where the run was) and the archive
mirrored to `WORKDIR/memory.json` for `spade.memory.show`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import ml_collections

from spade import grounding
from spade.selfplay import batching
from spade.selfplay import records
from spade.memory import archive as archive_lib
from spade.memory import dedup
from spade.selfplay import multihost


class LoopState:
  """Grounding, memory, the regeneration window, the delayed designer rows.

  One object, saved and restored whole with the checkpoint.
  """

  def __init__(self, config: ml_collections.ConfigDict):
    self.config = config
    self.corpus = None
    self._sharded = config.grounding.per_process_shards
    if config.grounding.enabled and config.train.mode == "spade":
      self.corpus = grounding.build_corpus(
          config.grounding,
          process_index=jax.process_index() if self._sharded else 0,
          process_count=jax.process_count() if self._sharded else 1,
      )
    self.archive = archive_lib.Archive(config.memory)
    # (iteration made, rows): designer rows waiting `optim.designer_delay`.
    self.delayed: list[tuple[int, list[batching.Row]]] = []
    # The pool being played and its plays (`records.Window`), or None.
    self.window = None

  def delay_designer_rows(
      self, iteration: int, rows: list[batching.Row], delay: int
  ) -> list[batching.Row]:
    """Queues this iteration's designer rows; returns the rows now due.

    Delayed rows keep the sampler's logprobs from when they were made, so
    their importance ratios (truncated at `optim.max_importance_weight` in
    the loss) correct for the staleness, as the reference's
    `--spade-proposer-training-delay` does.
    """
    self.delayed.append((iteration, list(rows)))
    due: list[batching.Row] = []
    while self.delayed and self.delayed[0][0] + delay <= iteration:
      due.extend(self.delayed.pop(0)[1])
    return due

  def documents(self, n: int) -> list[Any]:
    """n grounding documents, or n Nones when grounding is off."""
    if self.corpus is None:
      return [None] * n
    if not self._sharded or jax.process_count() == 1:
      return self.corpus.sample(n)
    # Process p draws the documents for prompts p, p + P, ...; every process
    # then holds the same list.
    count, me = jax.process_count(), jax.process_index()
    mine = self.corpus.sample(len(range(me, n, count)))
    parts = multihost.allgather_objects(
        [dataclasses.asdict(d) for d in mine], tag="documents"
    )
    docs = [None] * n
    for p, part in enumerate(parts):
      for j, d in enumerate(part):
        docs[p + j * count] = grounding.Document(**d)
    return docs

  def examples(self, document: Any, n: int) -> list[Any]:
    if not self.config.memory.enabled or n <= 0:
      return []
    return self.archive.prompt_examples(document, n)

  def archive_add(
      self,
      code: str,
      verdict: records.Verdict,
      iteration: int,
      doc_id,
      parent=None,
  ):
    """Adds a design; returns (entry id, id it duplicates or None)."""
    if not self.config.memory.enabled:
      return None, None
    return self.archive.add(
        code,
        verdict=verdict.to_dict(),
        iteration=iteration,
        grounding_id=doc_id,
        parent=parent,
    )

  def mutation_parent(self, seed: int) -> Any | None:
    """A high-regret archived environment to edit into a harder variant."""
    if not self.config.memory.enabled:
      return None
    return self.archive.mutation_parent(seed)

  def replay(self, n: int, iteration: int) -> list[Any]:
    if not self.config.memory.enabled or n <= 0:
      return []
    ids = self.archive.replay(n, iteration, iteration)
    return [self.archive.get(i) for i in ids]

  def update_stats(self, entry_id: str, **stats) -> None:
    if self.config.memory.enabled:
      self.archive.update_stats(entry_id, **stats)

  def diversity(self, codes: list[str]) -> float:
    """Mean pairwise MinHash distance of this iteration's programs."""
    return float(dedup.diversity(codes)) if len(codes) > 1 else 0.0

  def metrics(self, *, replayed: int, total: int) -> dict[str, float]:
    if not self.config.memory.enabled:
      return {}
    self.archive.set_replay_fraction(replayed / total if total else 0.0)
    return {k: float(v) for k, v in self.archive.metrics().items()}

  def state(self) -> dict:
    return {
        "corpus": self.corpus.state() if self.corpus is not None else None,
        "archive": self.archive.state_dict(),
        "delayed": [
            [it, [dataclasses.asdict(r) for r in rows]]
            for it, rows in self.delayed
        ],
        "window": self.window.to_json() if self.window is not None else None,
    }

  def load(self, state: dict) -> None:
    if self.corpus is not None and state.get("corpus") is not None:
      self.corpus.restore(state["corpus"])
    self.archive = archive_lib.Archive.from_state_dict(
        self.config.memory, state["archive"]
    )
    self.delayed = [
        (int(it), [batching.Row(**r) for r in rows])
        for it, rows in state.get("delayed", [])
    ]
    window = state.get("window")
    self.window = records.Window.from_json(window) if window else None

  def write_memory_file(self, workdir: str) -> None:
    """Mirrors the archive to WORKDIR/memory.json for the show CLI.

    Process 0 writes it (the archive is identical on every process).
    """
    if jax.process_index() != 0:
      return
    path = os.path.join(workdir, archive_lib.MEMORY_FILE)
    with open(path + ".tmp", "w") as f:
      json.dump(self.archive.state_dict(), f)
    os.replace(path + ".tmp", path)
