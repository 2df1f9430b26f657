"""Group-normalised (GRPO-style) advantages for the two roles.

An advantage is (r - mean_g) / (std_g + eps) over the members of r's group g,
with the population standard deviation (ddof 0) and eps 1e-8: the reference's
agent advantages (`spade/core/utils/trajectory_build.py`, mode "grpo":
`(r - np.mean) / (np.std + 1e-8)` per game). `normalize=False` only centres,
r - mean_g: the reference's designer advantages (blend rewards centred per
skill, `delayed_env_rewards._apply_centered_rewards`) and our option for the
agent. A group with one member or with all-equal rewards carries no
preference between its members, so its advantages are exactly 0 (the
reference's too: r - mean is 0 there); ours also zeroes a group whose std is
below 1e-6, float rounding that the reference would blow up to +-1.

Groups:

  agent     every episode of one environment, with and without the hint. The
            hinted episodes therefore sit in the same baseline as the
            unhinted ones: a hint that helps makes the hinted episodes'
            advantages higher, which is the behaviour the agent should learn
            to reach without the hint. `separate_arms=True` normalises each
            arm on its own instead.
  designer  every design made from the same grounding document / prompt
            group (an integer id per design), as the reference centres its
            designer rewards per skill group.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

Array = jax.Array

# Below this std a group counts as constant: float32 rewards that differ only
# by rounding must not become +-1 advantages.
_CONSTANT_STD = 1e-6


def _normalise(r, member, count, mean, var, eps, normalize=True):
  std = jnp.sqrt(jnp.maximum(var, 0.0))
  informative = (count >= 2) & (std > _CONSTANT_STD)
  adv = (r - mean) / (std + eps) if normalize else r - mean
  return jnp.where(member & informative, adv, 0.0)


@functools.partial(
    jax.jit, static_argnames=("eps", "separate_arms", "normalize")
)
def agent_advantages(
    returns: Array,
    mask: Array,
    *,
    eps: float = 1e-8,
    separate_arms: bool = False,
    normalize: bool = True,
) -> Array:
  """Per-environment normalised advantages of the agent's episodes.

  Args:
    returns: f32[E, K, 2] episode returns (index 0 no hint, 1 hint).
    mask: bool[E, K, 2], True where the episode exists.
    eps: added to the std.
    separate_arms: normalise each (environment, arm) on its own.
    normalize: divide by the group's std (the reference: per-game z-score);
      False only centres (ours, `config.regret.agent_advantage="center"`).

  Returns:
    f32[E, K, 2]; 0 at masked episodes and in singleton/constant groups.
  """
  if returns.shape != mask.shape or returns.ndim != 3:
    raise ValueError(
        f"returns {returns.shape} and mask {mask.shape} must both be [E, K, 2]"
    )
  axes = (1,) if separate_arms else (1, 2)
  m = mask.astype(jnp.float32)
  r = jnp.where(mask, returns.astype(jnp.float32), 0.0)
  count = jnp.sum(m, axis=axes, keepdims=True)
  mean = jnp.sum(r, axis=axes, keepdims=True) / jnp.maximum(count, 1.0)
  var = jnp.sum(m * (r - mean) ** 2, axis=axes, keepdims=True) / jnp.maximum(
      count, 1.0
  )
  return _normalise(r, mask, count, mean, var, eps, normalize)


@functools.partial(jax.jit, static_argnames=("eps", "normalize"))
def group_advantages(
    rewards: Array,
    group_ids: Array,
    mask: Array,
    *,
    eps: float = 1e-8,
    normalize: bool = True,
) -> Array:
  """Normalised advantages within groups given by integer ids.

  Args:
    rewards: f32[N], e.g. designer rewards (invalid designs already carry the
      invalid penalty, so they stay in their group as bad examples).
    group_ids: int[N]; equal ids share a baseline (any integer values).
    mask: bool[N], False for padding rows, which join no group.
    eps: added to the std.
    normalize: divide by the group's std; False only centres (the
      reference centres designer rewards per skill, no std division).

  Returns:
    f32[N]; 0 at masked rows and in singleton/constant groups.
  """
  if not rewards.shape == group_ids.shape == mask.shape or rewards.ndim != 1:
    raise ValueError(
        f"rewards {rewards.shape}, group_ids {group_ids.shape} and mask"
        f" {mask.shape} must all be [N]"
    )
  # N is a batch of designs (tens to hundreds): an [N, N] membership matrix
  # is cheaper than a sort and needs no bound on the ids.
  same = (group_ids[:, None] == group_ids[None, :]) & mask[None, :]
  same = same.astype(jnp.float32)
  r = jnp.where(mask, rewards.astype(jnp.float32), 0.0)
  count = jnp.sum(same, axis=1)
  mean = same @ r / jnp.maximum(count, 1.0)
  var = jnp.sum(same * (r[None, :] - mean[:, None]) ** 2, axis=1) / jnp.maximum(
      count, 1.0
  )
  return _normalise(r, mask, count, mean, var, eps, normalize)
