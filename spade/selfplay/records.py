"""Typed records of one self-play iteration; each is made once and flows one way.

  Design       what the designer sampled: prompt and completion tokens, the
               sampler's log-probs, the extracted program, its grounding and
               parent, and its `Verdict`.
  Verdict      the sandbox validator's judgement of one program (frozen; a
               duplicate or a missing required property is a new Verdict made
               with `rejected`, never an edit of the old one).
  Environment  a program the agent plays this iteration (a new design, an
               archive replay, or a fixed-pool/seed program) and its hint.
  Turn/Episode what the agent sampled, token for token, and what the
               environment answered (defined in `spade.agent.episodes`,
               made by `spade.agent.rollout`, re-exported here).
  Window       a regenerated pool and its plays R[E, S, K, 2] with a mask,
               a step appended each iteration of the window; environments
               that top it up join with their earlier steps masked.
  Scores       an iteration's regret, designer rewards and advantages, all
               from one jitted call over the window's plays
               (`spade.regret.scoring`).

Nothing here is mutated after it is made: a later phase that learns more
makes a new record (`dataclasses.replace`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from spade.agent.episodes import Episode  # pylint: disable=unused-import
from spade.agent.episodes import Turn  # pylint: disable=unused-import

# Verdict keys with a field of their own; every other key the validator
# reports (class name, description, solution text, timings, ...) is kept in
# `Verdict.details`.
_FIELDS = ("valid", "reason", "message", "has_hint", "properties")


@dataclasses.dataclass(frozen=True)
class Verdict:
  """The validator's judgement of one program.

  Attributes:
    valid: playable under the run's config.
    reason: a reason code ("ok", "syntax", "duplicate", ...).
    message: what was wrong, for the designer's memory and the logs.
    has_hint: the program defines its own `hint()`.
    properties: recorded findings beyond acceptance (deterministic, solution
      replayed, rewards in [0, 1], ...), which `environments.require` may
      demand and a designer reward may use.
    details: every other key of the validator's report.
    written_hint: a hint written for the program by the hint pass (kept with
      the verdict so a replay of the program reuses it).
  """

  valid: bool
  reason: str
  message: str = ""
  has_hint: bool = False
  properties: Mapping[str, bool] = dataclasses.field(default_factory=dict)
  details: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  written_hint: str | None = None

  @classmethod
  def from_dict(cls, d: Mapping[str, Any]) -> "Verdict":
    """From the validator's (or the archive's) JSON verdict."""
    if "valid" not in d:
      raise ValueError(
          f"a verdict needs a 'valid' key; got keys {sorted(d)} (verdicts"
          " come from SandboxPool.validate)"
      )
    details = {
        k: v for k, v in d.items() if k not in _FIELDS + ("written_hint",)
    }
    return cls(
        valid=bool(d["valid"]),
        reason=str(d.get("reason") or ("ok" if d["valid"] else "unknown")),
        message=str(d.get("message") or ""),
        has_hint=bool(d.get("has_hint", False)),
        properties=dict(d.get("properties") or {}),
        details=details,
        written_hint=d.get("written_hint"),
    )

  def to_dict(self) -> dict[str, Any]:
    """The JSON form the archive and `verdicts.json` keep."""
    out = dict(self.details)
    out.update(
        valid=self.valid,
        reason=self.reason,
        message=self.message,
        has_hint=self.has_hint,
        properties=dict(self.properties),
    )
    if self.written_hint is not None:
      out["written_hint"] = self.written_hint
    return out

  def rejected(self, reason: str, message: str) -> "Verdict":
    """This verdict turned invalid for `reason` (duplicate, requirement)."""
    return dataclasses.replace(
        self, valid=False, reason=reason, message=message
    )

  def with_hint(self, hint: str) -> "Verdict":
    return dataclasses.replace(self, written_hint=hint)


@dataclasses.dataclass(frozen=True)
class Design:
  """One sampled program and everything the update and memory need of it."""

  index: int  # position in this iteration's designs
  group: int  # designs of one prompt (document, skill) share a baseline
  prompt_ids: tuple[int, ...]
  completion_ids: tuple[int, ...]
  logprobs: tuple[float, ...]
  code: str
  verdict: Verdict
  grounding_id: str | None = None
  parent_id: str | None = None
  archive_id: str | None = None
  skill: str | None = None
  attempt: int = 0  # retries of an invalid design (reference: repair)

  @property
  def valid(self) -> bool:
    return self.verdict.valid

  @property
  def hint(self) -> str | None:
    """The hint the agent's hinted arm sees; None: the program's `hint()`."""
    return self.verdict.written_hint

  def to_json(self) -> dict[str, Any]:
    """A JSON-able form (the loop state keeps a window's designs)."""
    out = dataclasses.asdict(self)
    out["verdict"] = self.verdict.to_dict()
    return out

  @classmethod
  def from_json(cls, d: Mapping[str, Any]) -> "Design":
    d = dict(d)
    d["verdict"] = Verdict.from_dict(d["verdict"])
    return cls(**d)


@dataclasses.dataclass(frozen=True)
class Environment:
  """An environment the agent plays this iteration."""

  source: str
  # "design" | "replay" | "seed" | "pool", or "top_up": a design made inside
  # an open window (`designer.top_up`), not one of `Window.designs`
  origin: str
  hint: str | None  # a written hint; None: ask the environment's hint()
  design_index: int | None = None  # its design in `Window.designs`
  archive_id: str | None = None
  name: str = ""

  def to_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_json(cls, d: Mapping[str, Any]) -> "Environment":
    return cls(**d)


@dataclasses.dataclass(frozen=True)
class Timings:
  """Seconds a phase spent sampling, in the sandbox and updating."""

  sampling: float = 0.0
  sandbox: float = 0.0
  update: float = 0.0

  def __add__(self, other: "Timings") -> "Timings":
    return Timings(
        self.sampling + other.sampling,
        self.sandbox + other.sandbox,
        self.update + other.update,
    )


@dataclasses.dataclass(frozen=True, eq=False)
class Window:
  """A regenerated pool and every play of it over its window.

  The reference keeps each generated pool for `regeneration_interval`
  rollouts and recomputes the designer's reward from all the plays of the
  window: hinted plays at regeneration, unhinted plays every iteration.
  This is loop state, saved with the checkpoint.

  Attributes:
    start: the iteration that regenerated the pool.
    envs: the environments played over the window; those that topped it up
      (`with_envs`) come last, with no plays before the step they joined.
    designs: the designs made at regeneration (valid or not); a top-up's
      design is not among them (its rows are made when it is designed).
    returns: f32[E, S, K, 2], the return of play k of environment e at step
      offset s of the window (s = 0: the regeneration step), without ([...,
      0]) and with ([..., 1]) the hint; S the window's iterations so far.
    mask: bool[E, S, K, 2], True where that play was played and kept.
    timed_out: bool[E], whether a step() of the environment ran past its
      budget in the window.
    widths: the play slots K_s of each step's plays (K is their maximum),
      so a step is scored at the width it was played at.
  """

  start: int
  envs: tuple[Environment, ...]
  designs: tuple[Design, ...]
  returns: np.ndarray
  mask: np.ndarray
  timed_out: np.ndarray
  widths: tuple[int, ...] = ()

  def __post_init__(self):
    for a in (self.returns, self.mask, self.timed_out):
      a.flags.writeable = False  # frozen: a new step makes a new Window

  @classmethod
  def open(
      cls, start: int, envs: Sequence[Environment], designs: Sequence[Design]
  ) -> "Window":
    """A window regenerated at iteration `start`, with no plays yet."""
    n = max(len(envs), 1)
    return cls(
        start,
        tuple(envs),
        tuple(designs),
        np.zeros((n, 0, 1, 2), np.float32),
        np.zeros((n, 0, 1, 2), bool),
        np.zeros((n,), bool),
    )

  def with_envs(self, envs: Sequence[Environment]) -> "Window":
    """This window with `envs` added last, from its next step on: their
    rows of the earlier steps are masked (no plays), as the reference's
    pool top-up plays a new game from the rollout it was generated at."""
    if not envs:
      return self
    old = len(self.envs)
    n = old + len(envs)
    _, s, k, _ = self.returns.shape
    returns = np.zeros((n, s, k, 2), np.float32)
    mask = np.zeros((n, s, k, 2), bool)
    timed_out = np.zeros((n,), bool)
    # An empty window keeps one placeholder row (`open`); it is dropped.
    returns[:old], mask[:old] = self.returns[:old], self.mask[:old]
    timed_out[:old] = self.timed_out[:old]
    return dataclasses.replace(
        self,
        envs=self.envs + tuple(envs),
        returns=returns,
        mask=mask,
        timed_out=timed_out,
    )

  def with_plays(
      self,
      returns: np.ndarray,
      mask: np.ndarray,
      timed_out: np.ndarray,
  ) -> "Window":
    """This window with one iteration's plays f32[E, K, 2] (where `mask`)
    as its next step, and the environments whose step() timed out."""
    n, s, k, _ = self.returns.shape
    k = max(k, returns.shape[1])
    new_r = np.zeros((n, s + 1, k, 2), np.float32)
    new_m = np.zeros((n, s + 1, k, 2), bool)
    new_r[:, :s, : self.returns.shape[2]] = self.returns
    new_m[:, :s, : self.returns.shape[2]] = self.mask
    new_r[:, s, : returns.shape[1]] = np.where(mask, returns, 0.0)
    new_m[:, s, : returns.shape[1]] = mask
    hung = np.zeros((n,), bool)
    hung[: len(timed_out)] = np.asarray(timed_out, bool)
    return dataclasses.replace(
        self,
        returns=new_r,
        mask=new_m,
        timed_out=self.timed_out | hung,
        widths=self.widths + (returns.shape[1],),
    )

  def last_step(self) -> tuple[np.ndarray, np.ndarray]:
    """The latest step's plays f32/bool[E, K_s, 2], at the width played."""
    k = self.widths[-1]
    return self.returns[:, -1, :k], self.mask[:, -1, :k]

  def arm_mean(self, e: int, h: int) -> float | None:
    """Mean return of environment e's arm h over the window's plays."""
    m = self.mask[e, ..., h]
    return float(self.returns[e, ..., h][m].mean()) if m.any() else None

  def to_json(self) -> dict[str, Any]:
    """The window as JSON: per environment, per step, per arm, the returns
    played (in play order) and the indices k they were played at."""
    plays = [
        [
            [
                [
                    [float(self.returns[e, s, k, h]), k]
                    for k in np.flatnonzero(self.mask[e, s, :, h]).tolist()
                ]
                for h in (0, 1)
            ]
            for s in range(self.returns.shape[1])
        ]
        for e in range(self.returns.shape[0])
    ]
    return {
        "start": self.start,
        "envs": [e.to_json() for e in self.envs],
        "designs": [d.to_json() for d in self.designs],
        "shape": list(self.returns.shape),
        "widths": list(self.widths),
        "plays_by_step": plays,
        "timed_out": self.timed_out.tolist(),
    }

  @classmethod
  def from_json(cls, d: Mapping[str, Any]) -> "Window":
    """The inverse of `to_json`; also reads the lists of returns that
    checkpoints written before the array layout kept ("plays": per
    environment [unhinted, hinted], "steps": unhinted by step)."""
    envs = [Environment.from_json(e) for e in d["envs"]]
    designs = [Design.from_json(x) for x in d["designs"]]
    if "plays_by_step" in d:
      shape = tuple(d["shape"])
      widths = tuple(int(w) for w in d["widths"])
      steps = [
          [[list(map(tuple, arm)) for arm in step] for step in env]
          for env in d["plays_by_step"]
      ]
    else:
      # steps[e][s]: unhinted returns of step s; the hinted ones were
      # played at regeneration, step 0.
      unhinted = d.get("steps") or [[p[0]] for p in d["plays"]]
      steps = []
      for e, env_steps in enumerate(unhinted):
        hinted = list(d["plays"][e][1])
        steps.append(
            [
                [
                    [(v, k) for k, v in enumerate(plays)],
                    [(v, k) for k, v in enumerate(hinted)] if s == 0 else [],
                ]
                for s, plays in enumerate(env_steps or [[]])
            ]
        )
      s = max([len(x) for x in steps] + [0])
      k = max([len(a) for x in steps for step in x for a in step] + [1])
      shape = (max(len(envs), 1), s, k, 2)
      widths = tuple(
          max([len(e[j][h]) for e in steps if j < len(e) for h in (0, 1)])
          for j in range(s)
      )
    returns = np.zeros(shape, np.float32)
    mask = np.zeros(shape, bool)
    for e, env_steps in enumerate(steps):
      for s, arms in enumerate(env_steps):
        for h, plays in enumerate(arms):
          for value, k in plays:
            returns[e, s, int(k), h] = value
            mask[e, s, int(k), h] = True
    timed_out = np.zeros((shape[0],), bool)
    flags = [bool(t) for t in d.get("timed_out", [])][: shape[0]]
    timed_out[: len(flags)] = flags
    return cls(int(d["start"]), tuple(envs), tuple(designs), returns, mask,
               timed_out, widths)  # fmt: skip


@dataclasses.dataclass(frozen=True, eq=False)
class Scores:
  """An iteration's scores, from one jitted call over its window's plays
  (`spade.regret.scoring.make_iteration_scorer`; host numpy arrays).

  returns/mask are this iteration's plays f32/bool[E, K, 2] (index 0
  without, 1 with the hint), agent_advantages theirs per episode slot and
  `now` their summary (`estimators.summarize`); regret and env_score are per
  environment, design_reward and designer_advantages per design of the
  window (the advantages without the update's weight), all over the
  window's plays, summarised in `summary`.
  """

  returns: np.ndarray
  mask: np.ndarray
  agent_advantages: np.ndarray
  now: Mapping[str, float]
  regret: np.ndarray
  env_score: np.ndarray
  design_reward: np.ndarray
  designer_advantages: np.ndarray
  summary: Mapping[str, float]

  def arm_mean(self, e: int, h: int) -> float | None:
    """Mean return of environment e's arm h this iteration."""
    m = self.mask[e, :, h]
    return float(self.returns[e, :, h][m].mean()) if m.any() else None
