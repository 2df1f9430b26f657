"""Prioritised replay of archived environments, as in PLR.

The buffer is a static size plus a small pytree state passed in and out of
pure `jnp` functions (as JaxUED's level sampler does); the `Archive` wraps it
and maps slots to environment ids. A slot holds one replayable (valid)
environment with its score (its latest regret) and the iteration it was last
sampled or played.

Replay distribution over the valid slots (Jiang et al., "Prioritized Level
Replay", 2021):

  P = (1 - rho) * P_score + rho * P_stale
  P_score(i) ∝ (1 / rank(i)) ** (1 / temperature)
  P_stale(i) ∝ iteration - last_sampled(i)

rank 1 is the highest score; ties rank the lower slot (the older entry) first.
When every valid slot was sampled this iteration, P_stale is uniform over them.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp


class ReplayState(NamedTuple):
  """The replay buffer's state; a pytree of three [capacity] arrays."""

  scores: jax.Array  # float32: the slot's latest regret
  last_sampled: jax.Array  # int32: iteration last sampled or played
  valid: jax.Array  # bool: the slot holds a replayable environment


def init(capacity: int) -> ReplayState:
  """An empty buffer with `capacity` slots."""
  return ReplayState(
      scores=jnp.zeros((capacity,), jnp.float32),
      last_sampled=jnp.zeros((capacity,), jnp.int32),
      valid=jnp.zeros((capacity,), bool),
  )


@jax.jit
def insert(
    state: ReplayState, slot: int, score: float, iteration: int
) -> ReplayState:
  """Puts a replayable environment in `slot`."""
  return ReplayState(
      scores=state.scores.at[slot].set(score),
      last_sampled=state.last_sampled.at[slot].set(iteration),
      valid=state.valid.at[slot].set(True),
  )


@jax.jit
def remove(state: ReplayState, slot: int) -> ReplayState:
  """Empties `slot`."""
  return ReplayState(
      scores=state.scores.at[slot].set(0.0),
      last_sampled=state.last_sampled.at[slot].set(0),
      valid=state.valid.at[slot].set(False),
  )


@jax.jit
def update(
    state: ReplayState, slot: int, score: float, iteration: int
) -> ReplayState:
  """Records that `slot` was played at `iteration` with a new score."""
  return state._replace(
      scores=state.scores.at[slot].set(score),
      last_sampled=state.last_sampled.at[slot].set(iteration),
  )


@jax.jit
def ranks(scores: jax.Array, valid: jax.Array) -> jax.Array:
  """1-based rank of each slot by descending score; invalid slots last."""
  keyed = jnp.where(valid, -scores, jnp.inf)
  order = jnp.argsort(keyed, stable=True)
  return jnp.zeros_like(order).at[order].set(jnp.arange(1, len(order) + 1))


@jax.jit
def probabilities(
    state: ReplayState,
    iteration: int,
    temperature: float,
    staleness_coef: float,
) -> jax.Array:
  """The replay distribution over slots, float32[capacity].

  Args:
    state: the buffer.
    iteration: the current iteration (for staleness).
    temperature: > 0; higher flattens the score term.
    staleness_coef: rho in [0, 1].

  Returns:
    Probabilities summing to 1 over the valid slots (all zero if none).
  """
  valid = state.valid
  weights = jnp.where(
      valid,
      (1.0 / ranks(state.scores, valid).astype(jnp.float32))
      ** (1.0 / temperature),
      0.0,
  )
  p_score = weights / jnp.maximum(weights.sum(), 1e-30)
  stale = jnp.where(
      valid, jnp.maximum(iteration - state.last_sampled, 0), 0
  ).astype(jnp.float32)
  uniform = valid.astype(jnp.float32) / jnp.maximum(valid.sum(), 1)
  p_stale = jnp.where(
      stale.sum() > 0, stale / jnp.maximum(stale.sum(), 1e-30), uniform
  )
  return (1.0 - staleness_coef) * p_score + staleness_coef * p_stale


@functools.partial(jax.jit, static_argnames=("n",))
def sample(
    state: ReplayState,
    key: jax.Array,
    n: int,
    iteration: int,
    temperature: float,
    staleness_coef: float,
) -> tuple[ReplayState, jax.Array]:
  """Draws `n` distinct slots from the replay distribution.

  The caller keeps `n` at most the number of valid slots. Drawn slots are
  marked sampled at `iteration`, which resets their staleness.

  Args:
    state: the buffer.
    key: a JAX PRNG key.
    n: how many slots (static).
    iteration: the current iteration.
    temperature: the score term's temperature.
    staleness_coef: rho.

  Returns:
    (new state, int32[n] slots).
  """
  p = probabilities(state, iteration, temperature, staleness_coef)
  slots = jax.random.choice(key, p.shape[0], shape=(n,), replace=False, p=p)
  last = state.last_sampled.at[slots].set(iteration)
  return state._replace(last_sampled=last), slots
