"""Regret estimators and designer rewards over returns `R[env, k, hinted]`.

Every function here is a pure, jitted, masked reduction over

  returns  f32[E, K, 2]  episode returns in [0, 1]; [..., 0] without the
                         hint, [..., 1] with it
  mask     bool[E, K, 2] True where the episode exists (padding is False)
  valid    bool[E]       True where the environment passed validation

and returns f32[E], one score per environment. Degenerate groups never give
NaN: an arm with no episodes has mean 0 and makes any gap that needs it 0; a
single episode or all-equal returns give their plain value.

Win rate means the mean no-hint return (returns are clipped to [0, 1], so a
fractional return counts as a fractional win). The reference implementation
(`spade-rl/spade`, `recompute_delayed_env_rewards_blend`) takes the plateau of
the actor's *no-hint* win rate, and so does `reference_reward` here.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections

Array = jax.Array
# fn(returns f32[E, K, 2], mask bool[E, K, 2], valid bool[E]) -> f32[E].
RewardFn = Callable[[Array, Array, Array], Array]

NO_HINT = 0
HINT = 1


def _check(returns: Array, mask: Array, valid: Array) -> None:
  """Raises a clear error for shapes that cannot be returns/mask/valid."""
  if returns.ndim != 3 or returns.shape[-1] != 2:
    raise ValueError(
        f"returns must be f32[E, K, 2] (index 0 = no hint, 1 = hint), got"
        f" shape {returns.shape}"
    )
  if mask.shape != returns.shape:
    raise ValueError(
        f"mask shape {mask.shape} must equal returns shape {returns.shape}"
    )
  if valid.shape != returns.shape[:1]:
    raise ValueError(
        f"valid must be bool[E] with E={returns.shape[0]}, got {valid.shape}"
    )


def arm_counts(mask: Array) -> Array:
  """Episodes per environment and arm: f32[E, 2]."""
  return jnp.sum(mask.astype(jnp.float32), axis=1)


def arm_means(returns: Array, mask: Array) -> Array:
  """Masked mean return per environment and arm: f32[E, 2]; 0 when empty."""
  total = jnp.sum(jnp.where(mask, returns, 0.0), axis=1)
  return total / jnp.maximum(arm_counts(mask), 1.0)


def _both_arms(mask: Array) -> Array:
  """bool[E]: True where both arms have at least one episode."""
  return jnp.all(jnp.any(mask, axis=1), axis=-1)


@jax.jit
def hint_regret(returns: Array, mask: Array) -> Array:
  """max(0, mean_k R[e,k,1] - mean_k R[e,k,0]); 0 unless both arms exist."""
  means = arm_means(returns, mask)
  gap = means[:, HINT] - means[:, NO_HINT]
  return jnp.where(_both_arms(mask), jnp.maximum(gap, 0.0), 0.0)


@jax.jit
def max_regret(returns: Array, mask: Array) -> Array:
  """max_k R[e,k,1] - mean_k R[e,k,0] (not floored); 0 unless both arms."""
  best = jnp.max(jnp.where(mask[..., HINT], returns[..., HINT], -jnp.inf), 1)
  means = arm_means(returns, mask)
  both = _both_arms(mask)
  # `best` is -inf for an empty hint arm; select before subtracting so the
  # discarded branch never carries an inf into a gradient or a sum.
  return jnp.where(both, jnp.where(both, best, 0.0) - means[:, NO_HINT], 0.0)


@jax.jit
def win_rate(returns: Array, mask: Array) -> Array:
  """Mean no-hint return per environment: f32[E]; 0 with no episodes."""
  return arm_means(returns, mask)[:, NO_HINT]


@jax.jit
def learnability(returns: Array, mask: Array) -> Array:
  """p (1 - p) with p the no-hint win rate (PLR's learnability score)."""
  p = win_rate(returns, mask)
  return p * (1.0 - p)


def plateau(
    rate: Array, lo: float = 0.4, hi: float = 0.6, ramp: float = 0.25
) -> Array:
  """1 on [lo, hi], falling linearly to 0 over `ramp` on each side."""
  below = jnp.maximum(0.0, 1.0 - (lo - rate) / ramp)
  above = jnp.maximum(0.0, 1.0 - (rate - hi) / ramp)
  return jnp.where(rate < lo, below, jnp.where(rate > hi, above, 1.0))


def blend_reward(
    gap: Array,
    rate: Array,
    *,
    regret_weight: float,
    regret_scale: float,
    plateau_weight: float,
    plateau_lo: float,
    plateau_hi: float,
    plateau_ramp: float,
) -> Array:
  """The blend's one formula, on signals its callers choose:

    regret_weight * clip(gap / regret_scale, 0, 1)
        + plateau_weight * plateau(rate, plateau_lo, plateau_hi, plateau_ramp)

  `reference_reward` takes the gap and rate from one group's arms;
  `spade.regret.delayed.blend` from a regeneration window.
  """
  regret_term = jnp.clip(gap / regret_scale, 0.0, 1.0)
  difficulty = plateau(rate, plateau_lo, plateau_hi, plateau_ramp)
  return regret_weight * regret_term + plateau_weight * difficulty


@functools.partial(
    jax.jit,
    static_argnames=(
        "regret_weight",
        "regret_scale",
        "plateau_weight",
        "plateau_lo",
        "plateau_hi",
        "plateau_ramp",
    ),
)
def reference_reward(
    returns: Array,
    mask: Array,
    *,
    regret_weight: float = 0.4,
    regret_scale: float = 0.15,
    plateau_weight: float = 0.6,
    plateau_lo: float = 0.4,
    plateau_hi: float = 0.6,
    plateau_ramp: float = 0.25,
) -> Array:
  """The reference implementation's blend designer reward.

  0.4 * clip(gap / 0.15, 0, 1) + 0.6 * plateau(no-hint win rate), where gap is
  the unfloored mean hint gap (the reference floors after scaling, which is
  the same thing) and 0 unless both arms have episodes.

  Args:
    returns: f32[E, K, 2].
    mask: bool[E, K, 2].
    regret_weight: weight of the scaled, clipped regret term.
    regret_scale: the gap that earns the full regret term.
    plateau_weight: weight of the difficulty plateau term.
    plateau_lo: lower edge of the plateau's flat top.
    plateau_hi: upper edge of the flat top.
    plateau_ramp: width of the linear fall to 0 on each side.

  Returns:
    f32[E].
  """
  means = arm_means(returns, mask)
  gap = jnp.where(_both_arms(mask), means[:, HINT] - means[:, NO_HINT], 0.0)
  return blend_reward(
      gap,
      means[:, NO_HINT],
      regret_weight=regret_weight,
      regret_scale=regret_scale,
      plateau_weight=plateau_weight,
      plateau_lo=plateau_lo,
      plateau_hi=plateau_hi,
      plateau_ramp=plateau_ramp,
  )


@functools.partial(jax.jit, static_argnames=("quantile",))
def beta_lcb_regret(returns: Array, mask: Array, *, quantile: float = 0.1):
  """Lower confidence bound on the hint gap from Beta posteriors, floored at 0.

  Each arm's win probability gets a Beta(1 + wins, 1 + losses) posterior
  (wins = sum of returns, losses = episodes - wins, so fractional returns are
  fractional wins). The gap's posterior is approximated by a normal with the
  difference of the means and the sum of the Beta variances; its `quantile`
  quantile (0.1: a 90% one-sided bound) is the score. Few episodes give a wide
  posterior and so a bound near or below zero: this estimator prefers gaps
  that are both large and well measured.

  Args:
    returns: f32[E, K, 2].
    mask: bool[E, K, 2].
    quantile: in (0, 0.5]; smaller is more conservative.

  Returns:
    f32[E], max(0, bound).
  """
  if not 0.0 < quantile <= 0.5:
    raise ValueError(f"quantile={quantile} must be in (0, 0.5]")
  n = arm_counts(mask)
  wins = jnp.sum(jnp.where(mask, returns, 0.0), axis=1)
  a = 1.0 + wins
  b = 1.0 + jnp.maximum(n - wins, 0.0)
  mean = a / (a + b)
  var = a * b / ((a + b) ** 2 * (a + b + 1.0))
  gap = mean[:, HINT] - mean[:, NO_HINT]
  sd = jnp.sqrt(var[:, HINT] + var[:, NO_HINT])
  bound = gap + sd * jax.scipy.special.ndtri(quantile)
  return jnp.where(_both_arms(mask), jnp.maximum(bound, 0.0), 0.0)


_DEFAULTS = dict(
    invalid_penalty=-1.0,
    regret_weight=0.4,
    regret_scale=0.15,
    plateau_weight=0.6,
    plateau_lo=0.4,
    plateau_hi=0.6,
    plateau_ramp=0.25,
    lcb_quantile=0.1,
)


def _settings(regret_config) -> dict:
  """Reads the estimator settings, falling back to the documented defaults."""
  out = dict(_DEFAULTS)
  if regret_config is not None:
    for key in out:
      if key in regret_config:
        out[key] = float(regret_config[key])
  return out


# The registry: name -> factory(settings) -> score fn(returns, mask) -> f32[E]
# for valid environments. `register_estimator` adds one.
_REGISTRY: dict[str, Callable[[dict], Callable[[Array, Array], Array]]] = {}


def register_estimator(name: str):
  """Registers `factory(settings) -> fn(returns, mask)` under `name`."""

  def wrap(factory):
    if name in _REGISTRY:
      raise ValueError(f"regret estimator {name!r} is already registered")
    _REGISTRY[name] = factory
    return factory

  return wrap


register_estimator("hint")(lambda s: hint_regret)
register_estimator("max")(lambda s: max_regret)
register_estimator("learnability")(lambda s: learnability)
register_estimator("lcb")(
    lambda s: functools.partial(beta_lcb_regret, quantile=s["lcb_quantile"])
)
# The reference's `REWARD_VARIANT=solve_rate` (cmd/games/train_spade_30b.sh):
# the blend with plateau weight 1 and regret weight 0, the plateau alone.
register_estimator("solve_rate")(
    lambda s: lambda returns, mask: plateau(
        win_rate(returns, mask),
        s["plateau_lo"],
        s["plateau_hi"],
        s["plateau_ramp"],
    )
)
register_estimator("reference")(
    lambda s: functools.partial(
        reference_reward,
        regret_weight=s["regret_weight"],
        regret_scale=s["regret_scale"],
        plateau_weight=s["plateau_weight"],
        plateau_lo=s["plateau_lo"],
        plateau_hi=s["plateau_hi"],
        plateau_ramp=s["plateau_ramp"],
    )
)


def estimator_names() -> tuple[str, ...]:
  """The registered estimator names (`config.regret.estimator`)."""
  return tuple(_REGISTRY)


# Names accepted by `designer_reward` (config.regret.estimator).
ESTIMATORS = estimator_names()


def _scores(name: str, s: dict) -> Callable[[Array, Array], Array]:
  """The valid-environment score function registered under `name`."""
  if name not in _REGISTRY:
    raise ValueError(
        f"unknown regret estimator {name!r}; set config.regret.estimator to"
        f" one of {estimator_names()}"
    )
  return _REGISTRY[name](s)


def designer_reward(
    name: str, regret_config: ml_collections.ConfigDict | None = None
) -> RewardFn:
  """Returns the designer reward registered as `name`.

  Args:
    name: one of `ESTIMATORS` (`config.regret.estimator`).
    regret_config: `config.regret`, for the invalid penalty and the
      estimator's constants; the documented defaults when None.

  Returns:
    A jitted fn(returns f32[E, K, 2], mask bool[E, K, 2], valid bool[E]) ->
    f32[E]: the estimator's score for valid environments and
    `invalid_penalty` for invalid ones.
  """
  s = _settings(regret_config)
  return _designer_reward(name, tuple(sorted(s.items())))


@functools.lru_cache(maxsize=None)
def _designer_reward(name: str, settings: tuple) -> RewardFn:
  """One jitted function per (name, settings): compiled once per shape."""
  s = dict(settings)
  score = _scores(name, s)
  penalty = s["invalid_penalty"]

  @jax.jit
  def reward(returns: Array, mask: Array, valid: Array) -> Array:
    _check(returns, mask, valid)
    returns = returns.astype(jnp.float32)
    mask = mask.astype(bool)
    return jnp.where(valid.astype(bool), score(returns, mask), penalty)

  return reward


@jax.jit
def summarize(returns: Array, mask: Array, valid: Array) -> dict[str, Array]:
  """Scalar metrics over valid environments with episodes.

  Returns:
    {"return_hint", "return_nohint": mean return per arm over all episodes of
    valid environments; "regret_mean": mean hint regret over valid
    environments; "num_episodes"}.
  """
  _check(returns, mask, valid)
  m = mask & valid[:, None, None]
  mf = m.astype(jnp.float32)
  per_arm = jnp.sum(jnp.where(m, returns, 0.0), axis=(0, 1)) / jnp.maximum(
      jnp.sum(mf, axis=(0, 1)), 1.0
  )
  v = valid.astype(jnp.float32)
  regret = jnp.sum(hint_regret(returns, m) * v) / jnp.maximum(jnp.sum(v), 1.0)
  return {
      "return_nohint": per_arm[NO_HINT],
      "return_hint": per_arm[HINT],
      "regret_mean": regret,
      "num_episodes": jnp.sum(mf),
  }
