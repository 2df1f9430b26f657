"""The reference's environment memory: a FIFO of played environments.

`spade-rl/spade` `spade/core/env_memory.py`, rule for rule:

- `add` keeps the record's code cut to `code_chars` (2,000) characters and,
  past `capacity` (200, `--spade-env-memory-max-size`), drops the oldest.
  The reference adds every game played at a regeneration step, with its
  win rate (the fraction of that step's unhinted plays with reward > 0) and
  its matched-timing regret (`orchestrator._finalize_regrets`).
- `positives(skill, n=2)`: records of the skill with win rate in
  [0.15, 0.85], sorted by regret (descending, stable), the top max(3n, 10)
  kept, n drawn from them at random without replacement.
- `negatives(skill, n=1)`: records of the skill with win rate > 0.9 or
  < 0.1, n drawn at random; the prompt names them only ("class NAME").

The state (records and the random generator's state) is JSON-able, so it is
checkpointed with the rest of the curriculum (`state_dict`,
`load_state_dict`). `Record` carries the attributes that
`spade.designer.design_prompts.designer_messages` formats (`code`, `stats`,
`skill`, `name`, `negative`), so its examples go straight into a prompt.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Sequence

# The reference writes each game file with this first line
# (utils/game_files.save_game_file); the memory's snippet is cut from the
# file's text, so a snippet starts with it.
FILE_HEADER = '"""SPADE self-play generated game"""\n\n'
# Seeded records (`seed`, ours: `memory.seed_dir`) that name no skill match
# every skill's prompt; their win rate sits inside the positives' band.
ANY_SKILL = "*"
SEEDED_WIN_RATE = 0.5


def game_name(rollout_id: int, index: int, skill: str) -> str:
  """The reference's game file stem, which its negatives show as the class
  (`save_game_file`: game_{rollout:05d}_{index:03d}_{skill slug})."""
  slug = skill.lower().replace(" ", "_")
  return f"game_{rollout_id:05d}_{index:03d}_{slug}"


@dataclasses.dataclass
class Record:
  """One environment in memory (env_memory.EnvironmentRecord)."""

  name: str
  skill: str
  code: str
  win_rate: float
  regret: float = 0.0
  rollout_id: int = 0
  # Set on the copies `positives` / `negatives` return: how a prompt shows
  # the record.
  negative: bool = False

  @property
  def stats(self) -> dict[str, float]:
    """The form `design_prompts` reads (`win_rate_nohint`, `regret`)."""
    return {"win_rate_nohint": self.win_rate, "regret": self.regret}

  @property
  def verdict(self) -> dict[str, Any]:
    return {"valid": True}


class FifoMemory:
  """The reference's `EnvironmentMemory`; see the module docstring."""

  def __init__(
      self,
      capacity: int = 200,
      code_chars: int = 2000,
      seed: int | None = None,
      file_header: str = FILE_HEADER,
  ):
    if capacity < 1 or code_chars < 0:
      raise ValueError(
          f"capacity={capacity} must be >= 1 and code_chars={code_chars}"
          " >= 0 (config.memory.capacity, config.memory.code_chars)"
      )
    self.capacity = capacity
    self.code_chars = code_chars
    self.file_header = file_header
    self.records: list[Record] = []
    self._rng = random.Random(seed)

  def __len__(self) -> int:
    return len(self.records)

  def add(
      self,
      name: str,
      skill: str,
      code: str,
      win_rate: float,
      regret: float = 0.0,
      rollout_id: int = 0,
  ) -> Record:
    """Adds a played environment; the oldest goes past capacity."""
    text = self.file_header + code
    record = Record(
        name=name,
        skill=skill,
        code=text[: self.code_chars],
        win_rate=float(win_rate),
        regret=float(regret),
        rollout_id=int(rollout_id),
    )
    self.records.append(record)
    if len(self.records) > self.capacity:
      self.records = self.records[-self.capacity :]
    return record

  def seed(self, programs: Sequence[tuple[str, str, str]]) -> None:
    """Adds valid programs as if played (ours, `memory.seed_dir`).

    Each (name, skill, code) becomes a record of win rate `SEEDED_WIN_RATE`
    and regret 0, cut to `code_chars` like any record, so the reference's
    retrieval shows them from the first prompt, as its memory shows played
    games once it has any. `skill` may be `ANY_SKILL`.
    """
    for name, skill, code in programs:
      self.add(name, skill, code, win_rate=SEEDED_WIN_RATE, rollout_id=-1)

  def positives(self, skill: str | None, n: int = 2) -> list[Record]:
    """High-regret records of the skill in the difficulty band."""
    pool = [
        r
        for r in self.records
        if (not skill or r.skill in (skill, ANY_SKILL))
        and 0.15 <= r.win_rate <= 0.85
    ]
    if not pool or n <= 0:
      return []
    pool.sort(key=lambda r: r.regret, reverse=True)
    pool = pool[: max(n * 3, 10)]
    return [
        dataclasses.replace(r, negative=False)
        for r in self._rng.sample(pool, min(n, len(pool)))
    ]

  def negatives(self, skill: str | None, n: int = 1) -> list[Record]:
    """Too easy (> 0.9) or too hard (< 0.1) records of the skill."""
    bad = [
        r
        for r in self.records
        if (not skill or r.skill == skill)
        and (r.win_rate > 0.9 or r.win_rate < 0.1)
    ]
    if not bad or n <= 0:
      return []
    return [
        dataclasses.replace(r, negative=True)
        for r in self._rng.sample(bad, min(n, len(bad)))
    ]

  def prompt_examples(
      self, skill: str | None, n: int = 2, num_negatives: int = 1
  ) -> list[Record]:
    """What `_augment_prompt_with_memory` shows: n positives, then the
    negatives (`designer_messages(document, examples)` formats both)."""
    if not self.records:
      return []
    return self.positives(skill, n) + self.negatives(skill, num_negatives)

  def state_dict(self) -> dict[str, Any]:
    """JSON-able state: the records and the generator's state."""
    version, internal, gauss = self._rng.getstate()
    return {
        "capacity": self.capacity,
        "code_chars": self.code_chars,
        "records": [
            {k: v for k, v in dataclasses.asdict(r).items() if k != "negative"}
            for r in self.records
        ],
        "rng": [version, list(internal), gauss],
    }

  def load_state_dict(self, state: dict[str, Any]) -> None:
    """Restores `state_dict()`'s output."""
    self.records = [Record(**r) for r in state["records"]]
    version, internal, gauss = state["rng"]
    self._rng.setstate((version, tuple(internal), gauss))
