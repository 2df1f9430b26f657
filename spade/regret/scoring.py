"""One iteration's scores from its returns tensor, in one jitted function.

`make_scorer(config)` returns `score(returns, mask, valid, design_of_env,
design_valid, design_group) -> dict` of

  regret               f32[E]  hint regret (max(0, hinted - unhinted mean))
  env_score            f32[E]  the configured estimator's designer reward
  design_reward        f32[N]  env_score of each design's environment; the
                               invalid penalty for invalid designs
  designer_advantages  f32[N]  per skill group: centred (the reference) or
                               normalised by the group's std (GRPO); designs
                               still invalid after their attempts are left
                               out (the reference) or kept with the penalty
  agent_advantages     f32[E, K, 2]  per environment, z-scored (the
                               reference) or centred (ours); with
                               `agent.train_on_hinted=False` (the reference:
                               hinted plays only score the environment) only
                               the unhinted arm, baselined on itself
  return_hint, return_nohint, regret_mean, num_episodes   scalars

Everything is a pure function of arrays, so the whole scoring is one XLA
program and its behaviour is testable without a model or a sandbox.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections

from spade.regret import advantages
from spade.regret import estimators

Array = jax.Array


def make_scorer(config: ml_collections.ConfigDict) -> Callable[..., dict]:
  """The jitted scoring function for `config` (regret, agent sections)."""
  r = config.regret
  return _scorer(
      estimator=r.estimator,
      settings=tuple(sorted(estimators._settings(r).items())),  # pylint: disable=protected-access
      eps=float(r.advantage_eps),
      separate_arms=bool(r.separate_arms),
      designer_normalize=r.designer_advantage == "normalize",
      agent_normalize=r.agent_advantage == "normalize",
      train_on_hinted=bool(config.agent.train_on_hinted),
      drop_invalid=config.designer.invalid_designs == "drop",
  )


@functools.lru_cache(maxsize=None)
def _scorer(
    *,
    estimator: str,
    settings: tuple,
    eps: float,
    separate_arms: bool,
    designer_normalize: bool,
    agent_normalize: bool,
    train_on_hinted: bool,
    drop_invalid: bool,
):
  reward_fn = estimators.designer_reward(
      estimator, ml_collections.ConfigDict(dict(settings))
  )
  penalty = dict(settings)["invalid_penalty"]

  @jax.jit
  def score(returns, mask, valid, design_of_env, design_valid, design_group):
    """See the module docstring; design_of_env is -1 for non-designs."""
    returns = returns.astype(jnp.float32)
    mask = mask.astype(bool)
    env_score = reward_fn(returns, mask, valid)
    n = design_valid.shape[0]
    # Each valid design's environment score lands on its design; indices of
    # environments that are not designs (-1) are dropped.
    target = jnp.where(design_of_env >= 0, design_of_env, n)
    design_reward = jnp.full((n,), penalty, jnp.float32)
    design_reward = design_reward.at[target].set(env_score, mode="drop")
    design_reward = jnp.where(design_valid, design_reward, penalty)
    designer_adv = advantages.group_advantages(
        design_reward,
        design_group,
        design_valid if drop_invalid else jnp.ones((n,), bool),
        eps=eps,
        normalize=designer_normalize,
    )
    if train_on_hinted:
      agent_adv = advantages.agent_advantages(
          returns,
          mask,
          eps=eps,
          separate_arms=separate_arms,
          normalize=agent_normalize,
      )
    else:
      agent_adv = advantages.agent_advantages(
          returns,
          mask,
          eps=eps,
          separate_arms=True,
          normalize=agent_normalize,
      )
      agent_adv = agent_adv.at[..., estimators.HINT].set(0.0)
    out = dict(estimators.summarize(returns, mask, valid))
    out.update(
        regret=estimators.hint_regret(returns, mask),
        env_score=env_score,
        design_reward=design_reward,
        designer_advantages=designer_adv,
        agent_advantages=agent_adv,
    )
    return out

  return score
