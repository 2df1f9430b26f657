"""Designer rewards over a regeneration window, as the reference computes them.

The reference trains each design a fixed delay after it was sampled (4
rollouts, the regeneration interval) and scores it then, from every
unhinted play of its environment over the window
(`spade/core/utils/delayed_env_rewards.py`; the plays are bucketed by step
offset in `spade/slime/spade_rollout.py`) and the hinted plays of the
regeneration step. Inputs here, all masked:

  window  f32[E, S, K]  raw unhinted returns, step offset s of the window
                        (s = 0: the regeneration step), play k
  wmask   bool[E, S, K]
  hint    f32[E, H]     the regeneration step's hinted returns
  hmask   bool[E, H]

Raw signals per environment (f32[E]), registered by name
(`register_window_reward`, `window_reward_names()`; the reference's
`--spade-env-reward-variant`), beside the estimators of
`spade.regret.estimators`:

  blend               regret_weight * clip((r_hint - r_nohint) / regret_scale,
                      0, 1) + plateau_weight * plateau(window win rate);
                      r_nohint is the regeneration step's plays only
                      ("matched" timing, `recompute_delayed_env_rewards_blend`)
                      or the whole window's ("window", ours); the
                      plateau always takes the whole window.
  regret_based        max(0, r_hint - mean of the whole window), and
                      `timeout_penalty` (-0.5) for an environment whose
                      step() timed out (`recompute_delayed_env_rewards_regret`).
  micro_lp            max(0, late half mean - early half mean) over the steps
                      that have plays, the middle step in the late half; 0
                      with fewer than 2 such steps
                      (`recompute_delayed_env_rewards_micro_lp`).
  solve_rate          plateau(window win rate) alone (the recipe's
                      `REWARD_VARIANT=solve_rate`: the blend at plateau weight
                      1, regret weight 0).
  learning_potential  |window mean - mu_slow(skill)|, after the skill's
                      trackers took the skill's window mean
                      (`recompute_delayed_env_rewards` with update_lp;
                      `learning_potential.LearningPotential`). Its state is
                      `LPState`, passed in and out.

Win rate is the mean raw return, as the reference's `_mean_or_zero` of the
plays. `centre_per_skill` is the shared tail (`_apply_centered_rewards`):
each kept row minus its skill's mean, times `env_reward_scale`, the weight
min(#actor rows / #design rows x regeneration interval, 50)
(`utils/rewards.compute_env_reward_scale`). A blend below 0 is left out of
the update (`proposer_masked`); with the recipe's floored regret it never is.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp

from spade.regret import estimators

Array = jax.Array


def _mean(x: Array, m: Array, axis) -> Array:
  """Masked mean, 0 where empty (the reference's `_mean_or_zero`)."""
  m = m.astype(jnp.float32)
  return jnp.sum(jnp.where(m > 0, x, 0.0), axis=axis) / jnp.maximum(
      jnp.sum(m, axis=axis), 1.0
  )


def window_win_rate(window: Array, wmask: Array) -> Array:
  """Mean raw return over every play of the window: f32[E]."""
  return _mean(window, wmask, (1, 2))


def hint_rate(hint: Array, hmask: Array) -> Array:
  """r_hint, the mean hinted return of the regeneration step: f32[E]."""
  return _mean(hint, hmask, 1)


def matched_nohint(window: Array, wmask: Array) -> Array:
  """Mean unhinted return at the window's first step with plays (the
  reference's `offsets[0]`, the regeneration step when it has plays)."""
  present = jnp.any(wmask, axis=2)  # [E, S]
  first = jnp.argmax(present, axis=1)  # 0 when none
  step = jnp.take_along_axis(window, first[:, None, None], axis=1)[:, 0]
  smask = jnp.take_along_axis(wmask, first[:, None, None], axis=1)[:, 0]
  return _mean(step, smask, 1)


@functools.partial(
    jax.jit,
    static_argnames=(
        "timing",
        "regret_weight",
        "regret_scale",
        "plateau_weight",
        "plateau_lo",
        "plateau_hi",
        "plateau_ramp",
    ),
)
def blend(
    window: Array,
    wmask: Array,
    hint: Array,
    hmask: Array,
    *,
    timing: str = "matched",
    regret_weight: float = 0.4,
    regret_scale: float = 0.15,
    plateau_weight: float = 0.6,
    plateau_lo: float = 0.4,
    plateau_hi: float = 0.6,
    plateau_ramp: float = 0.25,
) -> Array:
  """The recipe's blend (see the module docstring): f32[E].

  The formula is `estimators.blend_reward`'s, as `reference_reward`'s is;
  only its inputs differ: r_nohint by `timing` and the plateau's rate over
  the whole window, with no both-arms gate.
  """
  if timing == "matched":
    nohint = matched_nohint(window, wmask)
  elif timing == "window":
    nohint = window_win_rate(window, wmask)
  else:
    raise ValueError(
        f"unknown timing {timing!r}; set config.regret.timing to 'matched'"
        " or 'window'"
    )
  return estimators.blend_reward(
      hint_rate(hint, hmask) - nohint,
      window_win_rate(window, wmask),
      regret_weight=regret_weight,
      regret_scale=regret_scale,
      plateau_weight=plateau_weight,
      plateau_lo=plateau_lo,
      plateau_hi=plateau_hi,
      plateau_ramp=plateau_ramp,
  )


@functools.partial(jax.jit, static_argnames=("timeout_penalty",))
def regret_based(
    window: Array,
    wmask: Array,
    hint: Array,
    hmask: Array,
    timed_out: Array,
    *,
    timeout_penalty: float = -0.5,
) -> Array:
  """max(0, r_hint - whole-window mean); the penalty where step() timed out."""
  regret = hint_rate(hint, hmask) - window_win_rate(window, wmask)
  return jnp.where(timed_out, timeout_penalty, jnp.maximum(regret, 0.0))


@jax.jit
def micro_lp(window: Array, wmask: Array) -> Array:
  """max(0, late - early) over the steps with plays: f32[E]."""
  present = jnp.any(wmask, axis=2)  # [E, S]
  n = jnp.sum(present, axis=1)  # steps with plays
  rank = jnp.cumsum(present, axis=1) - 1
  mid = (n // 2)[:, None]
  early = wmask & (present & (rank < mid))[..., None]
  late = wmask & (present & (rank >= mid))[..., None]
  gain = _mean(window, late, (1, 2)) - _mean(window, early, (1, 2))
  return jnp.where(n >= 2, jnp.maximum(gain, 0.0), 0.0)


@functools.partial(
    jax.jit, static_argnames=("plateau_lo", "plateau_hi", "plateau_ramp")
)
def solve_rate(
    window: Array,
    wmask: Array,
    *,
    plateau_lo: float = 0.4,
    plateau_hi: float = 0.6,
    plateau_ramp: float = 0.25,
) -> Array:
  """plateau(window win rate): f32[E]."""
  return estimators.plateau(
      window_win_rate(window, wmask), plateau_lo, plateau_hi, plateau_ramp
  )


class LPState(NamedTuple):
  """Per-skill learning-potential trackers (f32[G], f32[G], bool[G])."""

  mu_fast: Array
  mu_slow: Array
  seen: Array


def lp_init(num_skills: int) -> LPState:
  """Trackers that have seen nothing (the reference's None means)."""
  z = jnp.zeros((num_skills,), jnp.float32)
  return LPState(z, z, jnp.zeros((num_skills,), bool))


@functools.partial(jax.jit, static_argnames=("gamma_fast", "gamma_slow"))
def learning_potential(
    window: Array,
    wmask: Array,
    skill: Array,
    state: LPState,
    *,
    gamma_fast: float = 0.98,
    gamma_slow: float = 0.85,
) -> tuple[Array, LPState]:
  """|game window mean - mu_slow(skill)| after the skill's update.

  Each skill's trackers first take the mean of all its games' window plays
  (the first value sets both means; then mu = (1 - gamma) mu + gamma x, the
  reference's weights on the new value, --spade-gamma1 / --spade-gamma2);
  a skill with no plays keeps its trackers. A game with no plays scores 0.

  Returns:
    (f32[E] raw signals, the updated state).
  """
  g = state.mu_fast.shape[0]
  onehot = jax.nn.one_hot(skill, g, dtype=jnp.float32)  # [E, G]
  wm = wmask.astype(jnp.float32)
  plays = jnp.sum(wm, axis=(1, 2))  # [E]
  total = jnp.sum(jnp.where(wmask, window, 0.0), axis=(1, 2))
  skill_plays = plays @ onehot
  skill_mean = (total @ onehot) / jnp.maximum(skill_plays, 1.0)
  has = skill_plays > 0
  fast = jnp.where(
      state.seen,
      (1 - gamma_fast) * state.mu_fast + gamma_fast * skill_mean,
      skill_mean,
  )
  slow = jnp.where(
      state.seen,
      (1 - gamma_slow) * state.mu_slow + gamma_slow * skill_mean,
      skill_mean,
  )
  new = LPState(
      jnp.where(has, fast, state.mu_fast),
      jnp.where(has, slow, state.mu_slow),
      state.seen | has,
  )
  baseline = jnp.where(new.seen, new.mu_slow, 0.0)[skill]
  game_mean = total / jnp.maximum(plays, 1.0)
  return jnp.where(plays > 0, jnp.abs(game_mean - baseline), 0.0), new


def env_reward_scale(
    num_actor_rows: int,
    num_design_rows: int,
    regeneration_interval: int,
    max_scale: float = 50.0,
) -> float:
  """min(#actor rows / #design rows x interval, max_scale); 1 when either
  count is 0 (`compute_env_reward_scale`); max_scale <= 0 turns it off."""
  if max_scale <= 0 or num_actor_rows <= 0 or num_design_rows <= 0:
    return 1.0
  return min(
      num_actor_rows / num_design_rows * regeneration_interval, max_scale
  )


@jax.jit
def centre_per_skill(
    raw: Array, skill: Array, keep: Array, scale: Array | float = 1.0
) -> Array:
  """(raw - mean of the kept rows of its skill) x scale; 0 where not kept.

  keep: the designs that are trained (valid, and for the blend raw >= 0).
  """
  same = (skill[:, None] == skill[None, :]) & keep[None, :]
  same = same.astype(jnp.float32)
  r = jnp.where(keep, raw, 0.0)
  mean = same @ r / jnp.maximum(jnp.sum(same, axis=1), 1.0)
  return jnp.where(keep, (raw - mean) * scale, 0.0)


class WindowPlays(NamedTuple):
  """A window's plays as every window reward takes them (see the module
  docstring); `skill` is each environment's skill index (learning_potential's
  trackers), `timed_out` whether a step() of it ran past its budget."""

  window: Array  # f32[E, S, K]
  wmask: Array  # bool[E, S, K]
  hint: Array  # f32[E, H]
  hmask: Array  # bool[E, H]
  timed_out: Array  # bool[E]
  skill: Array  # i32[E]


# fn(plays, lp state) -> (raw f32[E], lp state): every window reward's form,
# so the scorer calls any of them the same way.
WindowRewardFn = Callable[[WindowPlays, LPState], tuple[Array, LPState]]

# name -> factory(settings) -> WindowRewardFn; `register_window_reward` adds
# one, and `config.regret.window_reward` may then name it.
_WINDOW_REWARDS: dict[str, Callable[[Mapping[str, Any]], WindowRewardFn]] = {}

# `config.regret` keys the window rewards read (`window_settings`).
_WINDOW_KEYS = (
    "timing", "regret_weight", "regret_scale", "plateau_weight", "plateau_lo",
    "plateau_hi", "plateau_ramp", "timeout_penalty", "lp_gamma_fast",
    "lp_gamma_slow",
)  # fmt: skip


def register_window_reward(name: str):
  """Registers `factory(settings) -> fn(plays, lp) -> (raw, lp)` as `name`."""

  def wrap(factory):
    if name in _WINDOW_REWARDS:
      raise ValueError(f"window reward {name!r} is already registered")
    _WINDOW_REWARDS[name] = factory
    return factory

  return wrap


def window_reward_names() -> tuple[str, ...]:
  """The registered window rewards (`config.regret.window_reward`)."""
  return tuple(_WINDOW_REWARDS)


def window_settings(regret_config) -> tuple[tuple[str, Any], ...]:
  """The `config.regret` values the window rewards read, hashable (a jitted
  scorer is cached per settings)."""
  return tuple((k, regret_config[k]) for k in _WINDOW_KEYS)


def window_reward(name: str, settings: Mapping[str, Any]) -> WindowRewardFn:
  """The window reward registered as `name`, with `settings`
  (`window_settings`)."""
  if name not in _WINDOW_REWARDS:
    raise ValueError(
        f"unknown regret.window_reward {name!r}; one of"
        f" {window_reward_names()}"
    )
  return _WINDOW_REWARDS[name](dict(settings))


def _plateau(s: Mapping[str, Any]) -> dict[str, float]:
  return dict(
      plateau_lo=s["plateau_lo"],
      plateau_hi=s["plateau_hi"],
      plateau_ramp=s["plateau_ramp"],
  )


register_window_reward("blend")(
    lambda s: lambda p, lp: (
        blend(
            p.window, p.wmask, p.hint, p.hmask, timing=s["timing"],
            regret_weight=s["regret_weight"], regret_scale=s["regret_scale"],
            plateau_weight=s["plateau_weight"], **_plateau(s),
        ),
        lp,
    )
)  # fmt: skip
register_window_reward("regret_based")(
    lambda s: lambda p, lp: (
        regret_based(
            p.window, p.wmask, p.hint, p.hmask, p.timed_out,
            timeout_penalty=s["timeout_penalty"],
        ),
        lp,
    )
)  # fmt: skip
register_window_reward("micro_lp")(
    lambda s: lambda p, lp: (micro_lp(p.window, p.wmask), lp)
)
register_window_reward("solve_rate")(
    lambda s: lambda p, lp: (
        solve_rate(p.window, p.wmask, **_plateau(s)),
        lp,
    )
)
register_window_reward("learning_potential")(
    lambda s: lambda p, lp: learning_potential(
        p.window, p.wmask, p.skill, lp,
        gamma_fast=s["lp_gamma_fast"], gamma_slow=s["lp_gamma_slow"],
    )
)  # fmt: skip
