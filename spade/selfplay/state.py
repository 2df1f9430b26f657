"""The loop state: grounding cursor, memory archive (with its replay
buffer), the delayed designer rows, the regeneration window, the
adaptive mode's difficulty windows, the static pool's draw cursor and the
programs whose play hung.

All of it is plain host-side state, identical on every process (every process
makes the same calls in the same order), saved whole as one JSON item in the
checkpoint (so a resume continues exactly where the run was) and the archive
mirrored to `WORKDIR/memory.json` for `spade.memory.show`.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import os
import random
from typing import Any

import jax
import ml_collections

from spade import grounding
from spade.environments import difficulty as difficulty_lib
from spade.environments import library
from spade.selfplay import batching
from spade.selfplay import records
from spade.memory import archive as archive_lib
from spade.memory import dedup
from spade.memory import fifo as fifo_lib
from spade.selfplay import adaptive
from spade.selfplay import multihost


# The seed library's categories as the games recipe's skills
# (`memory.seed_dir="library"`); its memory, language and tool-use seeds
# match no game skill and are left out.
LIBRARY_SKILLS = {
    "pattern": "Pattern Recognition",
    "deduction": "Logical Deduction",
    "arithmetic": "Mathematical Reasoning",
    "spatial": "Spatial Reasoning",
    "planning": "Optimization",
    "optimisation": "Optimization",
    "causal": "Causal Inference",
}


def seed_programs(seed_dir: str) -> list[tuple[str, str, str]]:
  """The (name, skill, code) programs `memory.seed_dir` names (ours).

  "library": the seed library's training programs (never its held-out
  ones), each under its category's skill (`LIBRARY_SKILLS`). Otherwise a
  folder: every `*.py` in it, in name order, shown to every skill's prompt.
  A file that does not parse or defines no class ending in "Env" is an
  error naming it (the folder should hold valid programs).
  """
  if seed_dir == "library":
    return [
        (p.name, LIBRARY_SKILLS[p.category], p.source)
        for p in library.train_programs()
        if p.category in LIBRARY_SKILLS
    ]
  if not os.path.isdir(seed_dir):
    raise ValueError(
        f"config.memory.seed_dir={seed_dir!r} is not a folder: give a folder"
        " of valid environment programs (*.py), 'library' for the seed"
        " library, or '' for an empty memory"
    )
  out = []
  for name in sorted(os.listdir(seed_dir)):
    if not name.endswith(".py"):
      continue
    path = os.path.join(seed_dir, name)
    with open(path) as f:
      code = f.read()
    try:
      tree = ast.parse(code)
    except SyntaxError as e:
      raise ValueError(
          f"config.memory.seed_dir: {path} does not parse ({e.msg}, line"
          f" {e.lineno}); fix or remove it"
      ) from e
    if not any(
        isinstance(n, ast.ClassDef) and n.name.endswith("Env")
        for n in tree.body
    ):
      raise ValueError(
          f"config.memory.seed_dir: {path} defines no class ending in 'Env';"
          " only environment programs belong there"
      )
    out.append((name[:-3], fifo_lib.ANY_SKILL, code))
  if not out:
    raise ValueError(
        f"config.memory.seed_dir={seed_dir!r} holds no *.py program"
    )
  return out


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
    # The reference's prompt memory (`memory.retrieval="reference"`): a
    # FIFO of the environments played at regeneration steps.
    self.fifo = fifo_lib.FifoMemory(
        config.memory.capacity, config.memory.code_chars, seed=config.seed
    )
    if config.memory.enabled and config.memory.seed_dir:
      self.fifo.seed(seed_programs(config.memory.seed_dir))
    # learning_potential's per-skill trackers (skill -> [fast, slow, seen]).
    self.lp: dict[str, list[float]] = {}
    # (iteration made, rows): designer rows waiting `optim.designer_delay`.
    self.delayed: list[tuple[int, list[batching.Row | None]]] = []
    # The pool being played and its plays (`records.Window`), or None.
    self.window = None
    # adaptive mode: one difficulty window per environment of the family,
    # and the (name, level) of each environment this iteration plays.
    self.difficulty: difficulty_lib.State = {}
    if config.train.mode == "adaptive":
      self.difficulty = adaptive.initial_state(config)
    self.played_levels: list[tuple[str, int]] = []
    # fixed_pool with pool_draw="without_replacement": the sorted pool's
    # names, those not yet drawn (in order) and the shuffling generator.
    self.pool_cursor: dict[str, Any] | None = None
    # `program_key`s of the programs whose play hung (an environment call
    # past its budget): not played again this run
    # (`environments.blacklist_hung`).
    self.hung: set[str] = set()

  def delay_designer_rows(
      self,
      iteration: int,
      rows: list[batching.Row | None],
      delay: int,
      flush: bool = False,
  ) -> list[batching.Row | None]:
    """Queues this iteration's designer rows; returns the rows now due
    (with `flush`, every queued row: the run's last iteration).

    None stands for a design without signal (`score.designer_samples`):
    never batched, it still counts among the update's samples
    (`optim.global_batch_size`) in its place.

    Delayed rows keep the sampler's logprobs from when they were made, so
    their importance ratios (truncated at `optim.max_importance_weight` in
    the loss) correct for the staleness, as the reference's
    `--spade-proposer-training-delay` does.
    """
    self.delayed.append((iteration, list(rows)))
    due: list[batching.Row | None] = []
    while self.delayed and (flush or self.delayed[0][0] + delay <= iteration):
      due.extend(self.delayed.pop(0)[1])
    return due

  def update_difficulty(self, scores: records.Scores) -> None:
    """adaptive mode: the windows learn from this iteration's plays."""
    if self.config.train.mode == "adaptive":
      self.difficulty = adaptive.update(
          self.config,
          self.difficulty,
          self.played_levels,
          scores.returns,
          scores.mask,
      )

  def draw_pool(self, names: list[str], n: int) -> list[str]:
    """n pool names drawn without replacement across iterations.

    The reference's `_select_static_games_without_replacement`
    (spade/slime/spade_rollout.py): the sorted names shuffled once by a
    generator seeded with `config.seed`, taken in order; when fewer than n
    are left, those are taken and the rest come from a fresh shuffle of the
    whole pool by the same generator, without the ones just taken (so a
    pool smaller than n gives the whole pool, once). A changed pool starts
    over.
    """
    canonical = sorted(names)
    cursor = self.pool_cursor
    if cursor is None or cursor["names"] != canonical:
      rng = random.Random(self.config.seed)
      remaining = list(canonical)
      rng.shuffle(remaining)
    else:
      rng = random.Random()
      rng.setstate(_rng_state(cursor["rng"]))
      remaining = list(cursor["remaining"])
    selected, remaining = remaining[:n], remaining[n:]
    if len(selected) < n:
      refill = list(canonical)
      rng.shuffle(refill)
      taken = set(selected)
      refill = [x for x in refill if x not in taken]
      needed = n - len(selected)
      selected.extend(refill[:needed])
      remaining = refill[needed:]
    self.pool_cursor = {
        "names": canonical,
        "remaining": remaining,
        "rng": _rng_json(rng.getstate()),
    }
    return selected

  def is_hung(self, source: str) -> bool:
    """Whether the program `source` hung in an earlier play of the run."""
    return program_key(source) in self.hung

  def hung_indices(self, envs: list[records.Environment]) -> frozenset[int]:
    """Indices of `envs` whose program hung earlier in the run."""
    return frozenset(
        e for e, env in enumerate(envs) if self.is_hung(env.source)
    )

  def blacklist_hung(
      self, envs: list[records.Environment], hung: list[bool]
  ) -> None:
    """Adds the programs of `envs` whose play hung this iteration (`hung`,
    per environment: `score.timed_out`, either arm) to the blacklist, under
    `environments.blacklist_hung`; the reference's `_hung_game_blacklist`
    (core/orchestrator.py), kept for the whole run and checkpointed."""
    if not self.config.environments.blacklist_hung:
      return
    self.hung.update(program_key(env.source) for env, h in zip(envs, hung) if h)

  def documents(self, n: int) -> list[Any]:
    """n grounding documents, or n Nones when grounding is off."""
    if self.corpus is None:
      return [None] * n
    if not self._sharded or jax.process_count() == 1:
      return self.corpus.sample(n)
    # Process p draws the documents for prompts p, p + P, ...; every process
    # then holds the same list.
    count = jax.process_count()
    mine = self.corpus.sample(len(multihost.slice_for_process(n)))
    parts = multihost.allgather_objects(
        [dataclasses.asdict(d) for d in mine], tag="documents"
    )
    docs = [None] * n
    for p, part in enumerate(parts):
      for j, d in enumerate(part):
        docs[p + j * count] = grounding.Document(**d)
    return docs

  def examples(self, document: Any, n: int, skill: str | None) -> list[Any]:
    """A designer prompt's memory examples: the reference's (`fifo`: n
    positives of `skill` in the difficulty band, then negatives by name) or
    ours (`memory.retrieval="archive"`: the archive's top regret, document
    neighbour, latest invalid)."""
    m = self.config.memory
    if not m.enabled or n <= 0:
      return []
    if m.retrieval == "reference":
      return self.fifo.prompt_examples(skill, n, m.num_negatives)
    return self.archive.prompt_examples(document, n)

  def remember_regeneration(
      self, it: int, window: records.Window, scores: records.Scores
  ) -> None:
    """Adds every design played at regeneration step `it` to the FIFO, with
    that step's win rate (share of unhinted plays with reward > 0) and
    matched regret (hinted minus unhinted mean), as the reference's
    orchestrator does."""
    if not self.config.memory.enabled:
      return
    for e, env in enumerate(window.envs):
      if env.design_index is None:
        continue
      d = window.designs[env.design_index]
      m = scores.mask[e]
      plain = scores.returns[e, :, 0][m[:, 0]]
      hinted = scores.returns[e, :, 1][m[:, 1]]
      if not plain.size:
        continue
      regret = (float(hinted.mean()) if hinted.size else 0.0) - float(
          plain.mean()
      )
      self.fifo.add(
          fifo_lib.game_name(it, d.index, d.skill or ""),
          d.skill or "",
          d.code,
          win_rate=float((plain > 0).mean()),
          regret=regret,
          rollout_id=it,
      )

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
    """Memory metrics and, in adaptive mode, `difficulty/<environment>`."""
    out = difficulty_lib.metrics(self.difficulty)
    out["rollout/hung_blacklist_size"] = float(len(self.hung))
    if not self.config.memory.enabled:
      return out
    self.archive.set_replay_fraction(replayed / total if total else 0.0)
    out.update({k: float(v) for k, v in self.archive.metrics().items()})
    return out

  def state(self) -> dict:
    return {
        "corpus": self.corpus.state() if self.corpus is not None else None,
        "archive": self.archive.state_dict(),
        "delayed": [
            [
                it,
                [
                    dataclasses.asdict(r) if r is not None else None
                    for r in rows
                ],
            ]
            for it, rows in self.delayed
        ],
        "window": self.window.to_json() if self.window is not None else None,
        "difficulty": difficulty_lib.state_dict(self.difficulty),
        "pool_cursor": self.pool_cursor,
        "fifo": self.fifo.state_dict(),
        "lp": self.lp,
        "hung": sorted(self.hung),
    }

  def load(self, state: dict) -> None:
    if self.corpus is not None and state.get("corpus") is not None:
      self.corpus.restore(state["corpus"])
    self.archive = archive_lib.Archive.from_state_dict(
        self.config.memory, state["archive"]
    )
    self.delayed = [
        (int(it), [batching.Row(**r) if r is not None else None for r in rows])
        for it, rows in state.get("delayed", [])
    ]
    window = state.get("window")
    self.window = records.Window.from_json(window) if window else None
    if state.get("difficulty"):
      self.difficulty = difficulty_lib.load_state(state["difficulty"])
    self.pool_cursor = state.get("pool_cursor")
    if state.get("fifo") is not None:
      self.fifo.load_state_dict(state["fifo"])
    self.lp = {k: list(v) for k, v in state.get("lp", {}).items()}
    self.hung = set(state.get("hung", []))

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


def program_key(source: str) -> str:
  """A program's name in the hung blacklist: the SHA-256 of its source."""
  return hashlib.sha256(source.encode()).hexdigest()


def _rng_json(state: tuple) -> list:
  """`random.Random.getstate()` as JSON (lists for tuples)."""
  version, internal, gauss = state
  return [version, list(internal), gauss]


def _rng_state(data: list) -> tuple:
  """The inverse of `_rng_json`."""
  version, internal, gauss = data
  return (version, tuple(internal), gauss)
