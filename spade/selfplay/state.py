"""The loop state: a frozen record that each iteration takes and returns.

`LoopState` holds what one iteration leaves for the next: the regeneration
window (`records.Window`), the designer rows waiting their delay, the
learning-potential trackers, the adaptive mode's difficulty windows, the
static pool's draw cursor, the programs whose play hung, and the memory's
stores (grounding corpus, archive with its replay buffer, prompt FIFO).
`spade.selfplay.loop.iteration` returns a new one (`dataclasses.replace`);
no phase assigns to it.

Everything here is a value, replaced and never changed, except the three
stores, which change in place through these methods:

  corpus   `documents` moves its cursor (the design phase).
  fifo     `examples` draws from its random generator (the design phase);
           `remember_regeneration` adds a regeneration's designs (the
           iteration).
  archive  `archive_add` archives a design (the design phase); `replay`
           draws replays and resets their staleness (the play phase,
           `play_phase.environments`); `remember_window` records a closing
           window's stats (the iteration). `examples` and `mutation_parent`
           only read it.

They stay mutable: the archive holds its entries, their MinHash signatures
and the replay buffer's arrays, which a copy per change would copy whole,
and the corpus and the FIFO are streams whose every draw advances a cursor
or a random generator. A state made by `replace` shares the three objects
with the one it came from, so an earlier state is no snapshot of them: use
the latest (the one the checkpoint saves). `restored` loads a checkpoint
into the stores of the new state it is called on.

All of it is identical on every process (every process makes the same calls
in the same order), saved whole as one JSON item in the checkpoint
(`to_json`; a resume continues exactly where the run was) and the archive
mirrored to `WORKDIR/memory.json` for `spade.memory.show`.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import os
import random
from typing import Any, Mapping, Sequence

import jax
import ml_collections
import numpy as np

from spade import grounding
from spade.environments import difficulty as difficulty_lib
from spade.environments import library
from spade.selfplay import batching
from spade.selfplay import records
from spade.memory import archive as archive_lib
from spade.memory import dedup
from spade.memory import fifo as fifo_lib
from spade.regret import delayed
from spade.selfplay import adaptive
from spade.selfplay import multihost
from spade.train import modes


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


@dataclasses.dataclass(frozen=True, eq=False)
class LearningPotential:
  """learning_potential's per-skill trackers (`spade.regret.delayed`), as
  arrays over the skills seen so far, in the order first seen."""

  skills: tuple[str, ...] = ()
  mu_fast: np.ndarray = dataclasses.field(
      default_factory=lambda: np.zeros((0,), np.float32)
  )
  mu_slow: np.ndarray = dataclasses.field(
      default_factory=lambda: np.zeros((0,), np.float32)
  )
  seen: np.ndarray = dataclasses.field(
      default_factory=lambda: np.zeros((0,), bool)
  )

  def take(self, skills: Sequence[str]) -> delayed.LPState:
    """The trackers of `skills`, in that order (zeros for a new skill)."""
    index = {s: i for i, s in enumerate(self.skills)}
    rows = np.array([index.get(s, -1) for s in skills], np.int64)
    known = rows >= 0

    def pick(values, dtype):
      out = np.zeros((len(rows),), dtype)
      out[known] = values[rows[known]]
      return out

    return delayed.LPState(
        pick(self.mu_fast, np.float32),
        pick(self.mu_slow, np.float32),
        pick(self.seen, bool),
    )

  def put(
      self, skills: Sequence[str], state: delayed.LPState
  ) -> "LearningPotential":
    """These trackers with those of `skills` replaced by `state`'s."""
    names = self.skills + tuple(s for s in skills if s not in self.skills)
    grow = len(names) - len(self.skills)
    fast = np.concatenate([self.mu_fast, np.zeros((grow,), np.float32)])
    slow = np.concatenate([self.mu_slow, np.zeros((grow,), np.float32)])
    seen = np.concatenate([self.seen, np.zeros((grow,), bool)])
    rows = [names.index(s) for s in skills]
    fast[rows] = np.asarray(state.mu_fast, np.float32)
    slow[rows] = np.asarray(state.mu_slow, np.float32)
    seen[rows] = np.asarray(state.seen, bool)
    return LearningPotential(names, fast, slow, seen)

  def to_json(self) -> dict[str, list[float]]:
    """skill -> [mu_fast, mu_slow, seen], the checkpoint's form."""
    return {
        s: [float(self.mu_fast[i]), float(self.mu_slow[i]),
            float(self.seen[i])]
        for i, s in enumerate(self.skills)
    }  # fmt: skip

  @classmethod
  def from_json(cls, d: Mapping[str, Sequence[float]]) -> "LearningPotential":
    skills = tuple(d)
    return cls(
        skills,
        np.array([d[s][0] for s in skills], np.float32),
        np.array([d[s][1] for s in skills], np.float32),
        np.array([bool(d[s][2]) for s in skills], bool),
    )


# Designer rows queued at an iteration: (iteration made, rows), None for a
# design without signal.
Queued = tuple[tuple[int, tuple[batching.Row | None, ...]], ...]


@dataclasses.dataclass(frozen=True, eq=False)
class LoopState:
  """What one iteration leaves for the next (see the module docstring).

  Made by `create` (or `create(...).restored(saved)` from a checkpoint);
  every later one by `dataclasses.replace` in `spade.selfplay.loop`.

  Attributes:
    config: the run's config.
    corpus: the grounding corpus (a store: reading it moves its cursor), or
      None when grounding is off.
    archive: the environment archive and its replay buffer (a store).
    fifo: the reference's prompt memory (`memory.retrieval="reference"`), a
      FIFO of the environments played at regeneration steps (a store).
    lp: learning_potential's per-skill trackers.
    delayed: designer rows waiting `optim.designer_delay` iterations.
    window: the pool being played and its plays, or None.
    difficulty: adaptive mode: one difficulty window per environment of the
      family.
    pool_cursor: fixed_pool with pool_draw="without_replacement": the sorted
      pool's names, those not yet drawn (in order) and the shuffling
      generator's state.
    hung: `program_key`s of the programs whose play hung (an environment
      call past its budget): not played again this run
      (`environments.blacklist_hung`).
    pool: the fixed pool, validated once per run (not checkpointed: a
      resumed run validates it again), or None until first needed.
  """

  config: ml_collections.ConfigDict
  corpus: Any
  archive: archive_lib.Archive
  fifo: fifo_lib.FifoMemory
  lp: LearningPotential = LearningPotential()
  delayed: Queued = ()
  window: records.Window | None = None
  difficulty: difficulty_lib.State = dataclasses.field(default_factory=dict)
  pool_cursor: Mapping[str, Any] | None = None
  hung: frozenset[str] = frozenset()
  pool: tuple[records.Environment, ...] | None = None

  @classmethod
  def create(cls, config: ml_collections.ConfigDict) -> "LoopState":
    """The state a run starts from."""
    corpus = None
    sharded = config.grounding.per_process_shards
    mode = modes.get(config)
    if config.grounding.enabled and mode.designs:
      corpus = grounding.build_corpus(
          config.grounding,
          process_index=jax.process_index() if sharded else 0,
          process_count=jax.process_count() if sharded else 1,
      )
    fifo = fifo_lib.FifoMemory(
        config.memory.capacity, config.memory.code_chars, seed=config.seed
    )
    if config.memory.enabled and config.memory.seed_dir:
      fifo.seed(seed_programs(config.memory.seed_dir))
    return cls(
        config=config,
        corpus=corpus,
        archive=archive_lib.Archive(config.memory),
        fifo=fifo,
        difficulty=(adaptive.initial_state(config) if mode.levelled else {}),
    )

  def replace(self, **changes) -> "LoopState":
    """This state with `changes` (`dataclasses.replace`)."""
    return dataclasses.replace(self, **changes)

  def delay_designer_rows(
      self,
      iteration: int,
      rows: Sequence[batching.Row | None],
      delay: int,
      flush: bool = False,
  ) -> tuple[list[batching.Row | None], Queued]:
    """Queues this iteration's designer rows; returns the rows now due
    (with `flush`, every queued row: the run's last iteration) and the
    queue left.

    None stands for a design without signal (`score.designer_samples`):
    never batched, it still counts among the update's samples
    (`optim.global_batch_size`) in its place.

    Delayed rows keep the sampler's logprobs from when they were made, so
    their importance ratios (truncated at `optim.max_importance_weight` in
    the loss) correct for the staleness, as the reference's
    `--spade-proposer-training-delay` does.
    """
    queue = self.delayed + ((iteration, tuple(rows)),)
    due: list[batching.Row | None] = []
    while queue and (flush or queue[0][0] + delay <= iteration):
      due.extend(queue[0][1])
      queue = queue[1:]
    return due, queue

  def draw_pool(
      self, names: list[str], n: int
  ) -> tuple[list[str], dict[str, Any]]:
    """n pool names drawn without replacement across iterations, and the
    cursor after them (`pool_cursor`).

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
    return selected, {
        "names": canonical,
        "remaining": remaining,
        "rng": _rng_json(rng.getstate()),
    }

  def is_hung(self, source: str) -> bool:
    """Whether the program `source` hung in an earlier play of the run."""
    return program_key(source) in self.hung

  def hung_indices(self, envs: Sequence[records.Environment]) -> frozenset[int]:
    """Indices of `envs` whose program hung earlier in the run."""
    return frozenset(
        e for e, env in enumerate(envs) if self.is_hung(env.source)
    )

  def with_hung(
      self, envs: Sequence[records.Environment], hung: Sequence[bool]
  ) -> frozenset[str]:
    """The blacklist with the programs of `envs` whose play hung this
    iteration (`hung`, per environment: `score.timed_out`, either arm)
    added, under `environments.blacklist_hung`; the reference's
    `_hung_game_blacklist` (core/orchestrator.py), kept for the whole run
    and checkpointed."""
    if not self.config.environments.blacklist_hung:
      return self.hung
    return self.hung | {
        program_key(env.source) for env, h in zip(envs, hung) if h
    }

  def documents(self, n: int) -> list[Any]:
    """n grounding documents, or n Nones when grounding is off."""
    if self.corpus is None:
      return [None] * n
    if not self.config.grounding.per_process_shards or (
        jax.process_count() == 1
    ):
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

  def remember_window(
      self, it: int, window: records.Window, scores: records.Scores
  ) -> None:
    """Archive stats of every archived environment of a closing window:
    its regret and win rates over every play of the window."""
    if not self.config.memory.enabled:
      return
    for e, env in enumerate(window.envs):
      if env.archive_id is None:
        continue
      self.archive.update_stats(
          env.archive_id,
          iteration=it,
          regret=float(scores.regret[e]),
          win_rate_hint=window.arm_mean(e, 1) or 0.0,
          win_rate_nohint=window.arm_mean(e, 0) or 0.0,
          episodes=int(window.mask[e].sum()),
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
    """n archived environments to play again (the archive's replay)."""
    if not self.config.memory.enabled or n <= 0:
      return []
    ids = self.archive.replay(n, iteration, iteration)
    return [self.archive.get(i) for i in ids]

  def metrics(self, *, replayed: int, total: int) -> dict[str, float]:
    """Memory metrics (the share of this iteration's environments that
    were replays among them) and, in adaptive mode,
    `difficulty/<environment>`."""
    out = difficulty_lib.metrics(self.difficulty)
    out["rollout/hung_blacklist_size"] = float(len(self.hung))
    if not self.config.memory.enabled:
      return out
    out.update({k: float(v) for k, v in self.archive.metrics().items()})
    out["memory/replay_fraction"] = replayed / total if total else 0.0
    return out

  def to_json(self) -> dict:
    """The whole state as one JSON item of the checkpoint."""
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
        "lp": self.lp.to_json(),
        "hung": sorted(self.hung),
    }

  def restored(self, saved: dict) -> "LoopState":
    """This (new) state with a checkpoint's `to_json` item loaded."""
    if self.corpus is not None and saved.get("corpus") is not None:
      self.corpus.restore(saved["corpus"])
    if saved.get("fifo") is not None:
      self.fifo.load_state_dict(saved["fifo"])
    window = saved.get("window")
    return self.replace(
        archive=archive_lib.Archive.from_state_dict(
            self.config.memory, saved["archive"]
        ),
        delayed=tuple(
            (
                int(it),
                tuple(
                    batching.Row(**r) if r is not None else None for r in rows
                ),
            )
            for it, rows in saved.get("delayed", [])
        ),
        window=records.Window.from_json(window) if window else None,
        difficulty=(
            difficulty_lib.load_state(saved["difficulty"])
            if saved.get("difficulty")
            else self.difficulty
        ),
        pool_cursor=saved.get("pool_cursor"),
        lp=LearningPotential.from_json(saved.get("lp", {})),
        hung=frozenset(saved.get("hung", [])),
    )

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


def diversity(codes: Sequence[str]) -> float:
  """Mean pairwise MinHash distance of an iteration's programs."""
  return float(dedup.diversity(codes)) if len(codes) > 1 else 0.0


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
