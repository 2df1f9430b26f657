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
from spade.regret import delayed
from spade.regret import estimators

Array = jax.Array


def make_scorer(config: ml_collections.ConfigDict) -> Callable[..., dict]:
  """The jitted scoring function for `config` (regret, agent sections)."""
  return _scorer(**_static(config))


def _designer_part(
    reward_fn,
    penalty,
    eps,
    designer_normalize,
    drop_invalid,
    returns,
    mask,
    valid,
    design_of_env,
    design_valid,
    design_group,
) -> dict:
  """env_score, design_reward and designer_advantages (see above)."""
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
  return dict(
      env_score=env_score,
      design_reward=design_reward,
      designer_advantages=designer_adv,
  )


def _agent_part(
    eps, separate_arms, agent_normalize, train_on_hinted, returns, mask
) -> Array:
  """agent_advantages f32[E, K, 2] (see above)."""
  if train_on_hinted:
    return advantages.agent_advantages(
        returns,
        mask,
        eps=eps,
        separate_arms=separate_arms,
        normalize=agent_normalize,
    )
  agent_adv = advantages.agent_advantages(
      returns,
      mask,
      eps=eps,
      separate_arms=True,
      normalize=agent_normalize,
  )
  return agent_adv.at[..., estimators.HINT].set(0.0)


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
  designer, agent = _parts(
      estimator, settings, eps, separate_arms, designer_normalize,
      agent_normalize, train_on_hinted, drop_invalid,
  )  # fmt: skip

  @jax.jit
  def score(returns, mask, valid, design_of_env, design_valid, design_group):
    """See the module docstring; design_of_env is -1 for non-designs."""
    returns = returns.astype(jnp.float32)
    mask = mask.astype(bool)
    out = designer(
        returns, mask, valid, design_of_env, design_valid, design_group
    )
    agent_adv = agent(returns, mask)
    summary = dict(estimators.summarize(returns, mask, valid))
    summary.update(
        regret=estimators.hint_regret(returns, mask),
        agent_advantages=agent_adv,
        **out,
    )
    return summary

  return score


def _parts(
    estimator,
    settings,
    eps,
    separate_arms,
    designer_normalize,
    agent_normalize,
    train_on_hinted,
    drop_invalid,
):
  """The designer's and the agent's scoring functions of one config."""
  reward_fn = estimators.designer_reward(
      estimator, ml_collections.ConfigDict(dict(settings))
  )
  penalty = dict(settings)["invalid_penalty"]
  designer = functools.partial(
      _designer_part, reward_fn, penalty, eps, designer_normalize,
      drop_invalid,
  )  # fmt: skip
  agent = functools.partial(
      _agent_part, eps, separate_arms, agent_normalize, train_on_hinted
  )
  return designer, agent


def _static(config: ml_collections.ConfigDict) -> dict:
  """`make_scorer`'s settings of `config`, hashable."""
  r = config.regret
  return dict(
      estimator=r.estimator,
      settings=tuple(sorted(estimators._settings(r).items())),  # pylint: disable=protected-access
      eps=float(r.advantage_eps),
      separate_arms=bool(r.separate_arms),
      designer_normalize=r.designer_advantage == "normalize",
      agent_normalize=r.agent_advantage == "normalize",
      train_on_hinted=bool(config.agent.train_on_hinted),
      drop_invalid=config.designer.invalid_designs == "drop",
  )


def make_iteration_scorer(
    config: ml_collections.ConfigDict, closes: bool
) -> Callable[..., tuple[dict, delayed.LPState]]:
  """The one jitted call that scores an iteration from its window's plays.

  `score(returns f32[E, S, K, 2], mask, timed_out bool[E], valid bool[E],
  design_of_env i32[E], design_valid bool[N], design_group i32[N],
  design_skill i32[N], lp delayed.LPState, width) -> (dict, lp)`, S the
  window's steps so far (the last is this iteration's, played `width`
  slots wide: static), gives

    agent_advantages, now   this iteration's plays (step S - 1, its first
                            `width` slots): the agent's advantages
                            f32[E, width, 2] and `summarize`
    regret, env_score, design_reward, designer_advantages, summary
                            every play of the window, as `make_scorer`
                            scores them

  and, when the window `closes` under `regret.estimator="reference"`, the
  design reward of `regret.window_reward` (registered in
  `spade.regret.delayed`; its state `lp` passed in and out) centred per
  skill (`design_skill`) over the designs that are trained. The designer's
  advantages come back without `delayed.env_reward_scale`'s weight, which
  needs the agent's rows (`spade.selfplay.score.designer_samples`).
  """
  r = config.regret
  reward = r.window_reward if closes and r.estimator == "reference" else None
  return _iteration_scorer(
      **_static(config),
      window_reward=reward,
      window_settings=delayed.window_settings(r) if reward else (),
      penalize=config.designer.invalid_designs == "penalize",
  )


@functools.lru_cache(maxsize=None)
def _iteration_scorer(
    *,
    estimator,
    settings,
    eps,
    separate_arms,
    designer_normalize,
    agent_normalize,
    train_on_hinted,
    drop_invalid,
    window_reward,
    window_settings,
    penalize,
):
  designer, agent = _parts(
      estimator, settings, eps, separate_arms, designer_normalize,
      agent_normalize, train_on_hinted, drop_invalid,
  )  # fmt: skip
  penalty = dict(settings)["invalid_penalty"]
  reward = window_reward and delayed.window_reward(
      window_reward, window_settings
  )

  @functools.partial(jax.jit, static_argnames=("width",))
  def score(
      returns,
      mask,
      timed_out,
      valid,
      design_of_env,
      design_valid,
      design_group,
      design_skill,
      lp,
      width,
  ):
    returns = returns.astype(jnp.float32)
    mask = mask.astype(bool)
    e, s, k, _ = returns.shape
    # This iteration's plays at the width they were played: its scores do
    # not depend on how wide another step of the window was.
    now_r, now_m = returns[:, -1, :width], mask[:, -1, :width]
    flat_r = returns.reshape(e, s * k, 2)
    flat_m = mask.reshape(e, s * k, 2)
    out = designer(
        flat_r, flat_m, valid, design_of_env, design_valid, design_group
    )
    out.update(
        agent_advantages=agent(now_r, now_m),
        now=estimators.summarize(now_r, now_m, valid),
        summary=estimators.summarize(flat_r, flat_m, valid),
        regret=estimators.hint_regret(flat_r, flat_m),
    )
    if not reward:
      return out, lp
    n = design_valid.shape[0]
    has_design = design_of_env >= 0
    env_skill = jnp.where(
        has_design, design_skill[jnp.maximum(design_of_env, 0)], 0
    )
    plays = delayed.WindowPlays(
        returns[..., 0], mask[..., 0], flat_r[..., 1], flat_m[..., 1],
        timed_out, env_skill,
    )  # fmt: skip
    raw_env, lp = reward(plays, lp)
    target = jnp.where(has_design, design_of_env, n)
    raw = jnp.full((n,), penalty, jnp.float32)
    raw = raw.at[target].set(raw_env, mode="drop")
    has_env = jnp.zeros((n,), bool).at[target].set(True, mode="drop")
    keep = design_valid & has_env & (raw >= 0)
    if penalize:
      # Ours: an invalid design stays in its skill's group at
      # regret.invalid_penalty, so its rows are pushed down and its valid
      # neighbours up (the reference's "drop" leaves it out).
      keep = keep | ~design_valid
    out.update(
        design_reward=raw,
        designer_advantages=delayed.centre_per_skill(raw, design_skill, keep),
    )
    return out, lp

  return score
