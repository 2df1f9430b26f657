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
  Scores       regret, designer rewards and advantages, all from one jitted
               function over the returns tensor (`spade.regret.scoring`).

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
  origin: str  # "design" | "replay" | "seed" | "pool"
  hint: str | None  # a written hint; None: ask the environment's hint()
  design_index: int | None = None
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


@dataclasses.dataclass(frozen=True)
class Window:
  """A regenerated pool and every play of it over its window.

  The reference keeps each generated pool for `regeneration_interval`
  rollouts and recomputes the designer's reward from all the plays of the
  window: hinted plays at regeneration, unhinted plays every iteration.
  This is loop state, saved with the checkpoint.

  Attributes:
    start: the iteration that regenerated the pool.
    envs: the environments played over the window.
    designs: the designs made at regeneration (valid or not).
    plays: per environment, [unhinted returns, hinted returns] so far.
    steps: per environment, its unhinted returns of each iteration of the
      window in order (step offset 0: the regeneration step), for the
      reference's matched-timing and per-step window rewards.
    timed_out: per environment, whether a step() of it ran past its budget.
  """

  start: int
  envs: list[Environment]
  designs: list[Design]
  plays: list[list[list[float]]]
  steps: list[list[list[float]]] = dataclasses.field(default_factory=list)
  timed_out: list[bool] = dataclasses.field(default_factory=list)

  def with_plays(
      self,
      returns: np.ndarray,
      mask: np.ndarray,
      timed_out: Sequence[bool] = (),
  ) -> "Window":
    """This window with one iteration's returns f32[E, K, 2] added where
    `mask` is True (and the environments whose step() timed out)."""
    n = len(self.envs)
    new = [
        [
            [float(r) for r, m in zip(returns[e, :, h], mask[e, :, h]) if m]
            for h in (0, 1)
        ]
        for e in range(n)
    ]
    steps = self.steps or [[] for _ in range(n)]
    was = list(self.timed_out) or [False] * n
    now = list(timed_out) or [False] * n
    return dataclasses.replace(
        self,
        plays=[
            [self.plays[e][h] + new[e][h] for h in (0, 1)] for e in range(n)
        ],
        steps=[list(steps[e]) + [new[e][0]] for e in range(n)],
        timed_out=[bool(was[e] or now[e]) for e in range(n)],
    )

  def arrays(self) -> tuple[np.ndarray, np.ndarray]:
    """The accumulated plays as returns f32[E, K, 2] with their mask."""
    k = max([len(p) for env in self.plays for p in env] + [1])
    returns = np.zeros((max(len(self.envs), 1), k, 2), np.float32)
    mask = np.zeros_like(returns, bool)
    for e, env in enumerate(self.plays):
      for h, plays in enumerate(env):
        returns[e, : len(plays), h] = plays
        mask[e, : len(plays), h] = True
    return returns, mask

  def to_json(self) -> dict[str, Any]:
    return {
        "start": self.start,
        "envs": [e.to_json() for e in self.envs],
        "designs": [d.to_json() for d in self.designs],
        "plays": self.plays,
        "steps": self.steps,
        "timed_out": self.timed_out,
    }

  @classmethod
  def from_json(cls, d: Mapping[str, Any]) -> "Window":
    return cls(
        start=int(d["start"]),
        envs=[Environment.from_json(e) for e in d["envs"]],
        designs=[Design.from_json(x) for x in d["designs"]],
        plays=[[list(map(float, p)) for p in env] for env in d["plays"]],
        steps=[
            [list(map(float, p)) for p in env] for env in d.get("steps", [])
        ],
        timed_out=[bool(t) for t in d.get("timed_out", [])],
    )


@dataclasses.dataclass(frozen=True)
class Scores:
  """Everything scored from one iteration's returns (host numpy arrays).

  returns/mask are f32/bool[E, K, 2] (index 0 without, 1 with the hint);
  env_score and regret are per environment; design_reward and
  designer_advantages per design; agent_advantages per episode slot.
  """

  returns: np.ndarray
  mask: np.ndarray
  regret: np.ndarray
  env_score: np.ndarray
  design_reward: np.ndarray
  designer_advantages: np.ndarray
  agent_advantages: np.ndarray
  summary: Mapping[str, float]
