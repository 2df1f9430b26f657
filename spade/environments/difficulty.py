"""RLVE's sliding-window difficulty controller, for any family with levels.

The reference (`spade-rl/spade` `spade/core/difficulty_controller.py`,
`SlidingWindowController`, with `--spade-difficulty-tau-acc 0.9
--spade-difficulty-tau-num 128 --spade-difficulty-d-delta 4` in
`cmd/games/train_fixed_rlve_*.sh` and the adapter's range [0, 20]) keeps,
per environment, a window [low, high] of integer levels:

- it starts at [min_level, min_level] ([0, 0] for RLVE);
- a problem's level is drawn uniformly from [low, high]
  (`random.randint(low, high)`; one level per environment and step, shared
  by that step's plays, `fixed_env_orchestrator`);
- only plays at `high` are counted (a success is a reward > 0, the sum of
  the episode's rewards there); once `tau_num` of them are in, the window
  is promoted if their accuracy is >= `tau_acc` and high < `max_level`
  (high += 1, low = max(low, high - d_delta + 1)), and the counts restart
  whether or not it was promoted.

Here the controller is a static `SlidingWindow` (the constants) and a
JSON-able state (one `Window` per environment name) passed in and out, as
jaxued keeps a level buffer; draws are counter-based (`sample(state, env,
key)`), so a resumed run draws what an uninterrupted one would, and the
state needs no generator. Nothing is RLVE-specific: a curriculum over any
environments with integer levels uses it unchanged.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Iterable, Mapping


@dataclasses.dataclass(frozen=True)
class Window:
  """One environment's window and its counts at `high`."""

  low: int = 0
  high: int = 0
  successes_at_high: int = 0
  attempts_at_high: int = 0


State = dict[str, Window]


@dataclasses.dataclass(frozen=True)
class SlidingWindow:
  """The controller's constants (RLVE's and the reference's defaults)."""

  tau_acc: float = 0.9
  tau_num: int = 128
  d_delta: int = 4
  min_level: int = 0
  max_level: int = 20

  def __post_init__(self):
    if self.tau_num < 1 or self.d_delta < 1:
      raise ValueError(
          f"tau_num={self.tau_num} and d_delta={self.d_delta} must be >= 1"
      )
    if self.max_level < self.min_level:
      raise ValueError(
          f"max_level={self.max_level} < min_level={self.min_level}"
      )

  def init(self, envs: Iterable[str]) -> State:
    """Every environment at [min_level, min_level]."""
    return {e: Window(self.min_level, self.min_level) for e in envs}

  def sample(self, state: Mapping[str, Window], env: str, key: int) -> int:
    """A level drawn uniformly from env's window; `key` (e.g. a hash of
    seed, step and environment) fixes the draw."""
    w = state.get(env, Window(self.min_level, self.min_level))
    return random.Random(key).randint(w.low, w.high)

  def update(
      self, state: Mapping[str, Window], env: str, level: int, reward: float
  ) -> State:
    """The state after one play of env at `level` with `reward`."""
    out = dict(state)
    w = out.get(env, Window(self.min_level, self.min_level))
    if level != w.high:
      out[env] = w
      return out
    attempts = w.attempts_at_high + 1
    successes = w.successes_at_high + (1 if reward > 0 else 0)
    low, high = w.low, w.high
    if attempts >= self.tau_num:
      if successes / attempts >= self.tau_acc and high < self.max_level:
        high += 1
        low = max(low, high - self.d_delta + 1)
      attempts = successes = 0
    out[env] = Window(low, high, successes, attempts)
    return out

  def update_many(
      self,
      state: Mapping[str, Window],
      plays: Iterable[tuple[str, int, float]],
  ) -> State:
    """`update` over (env, level, reward) plays, in order."""
    out = dict(state)
    for env, level, reward in plays:
      out = self.update(out, env, level, reward)
    return out


def metrics(state: Mapping[str, Window]) -> dict[str, float]:
  """`difficulty/<env>` (each window's top level) and the reference's
  aggregates (`difficulty/avg_high`, `avg_low`, `max_high`, `num_envs`)."""
  if not state:
    return {}
  highs = [w.high for w in state.values()]
  lows = [w.low for w in state.values()]
  out = {f"difficulty/{env}": float(w.high) for env, w in state.items()}
  out.update(
      {
          "difficulty/avg_high": sum(highs) / len(highs),
          "difficulty/avg_low": sum(lows) / len(lows),
          "difficulty/max_high": float(max(highs)),
          "difficulty/num_envs": float(len(state)),
      }
  )
  return out


def state_dict(state: Mapping[str, Window]) -> dict[str, Any]:
  """JSON-able form of a state (for the checkpoint)."""
  return {env: dataclasses.asdict(w) for env, w in state.items()}


def load_state(data: Mapping[str, Mapping[str, int]]) -> State:
  """The inverse of `state_dict`."""
  return {
      env: Window(**{k: int(v) for k, v in w.items()})
      for env, w in data.items()
  }
