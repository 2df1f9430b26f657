"""Score: returns R[env, k, hinted] -> `Scores` -> the update's rows.

`returns` reads played episodes into arrays, `score` computes every score
from arrays (one jitted call, `spade.regret.scoring`), `agent_samples` and
`designer_samples` keep the rows that carry signal (advantage != 0) in the
samples they belong to, and `update_rows` shapes them into the update's
batch (`optim.global_batch_size`).
"""

from __future__ import annotations

import dataclasses

import jax
import ml_collections
import numpy as np

from spade.agent import rollout
from spade.regret import delayed
from spade.regret import scoring as regret_scoring
from spade.selfplay import batching
from spade.selfplay import records


def hint_episodes(config: ml_collections.ConfigDict) -> int:
  """Hinted plays per environment (`agent.hint_episodes_per_env`, 0: as
  many as unhinted)."""
  a = config.agent
  return a.hint_episodes_per_env or a.episodes_per_env


def returns(
    config: ml_collections.ConfigDict,
    envs: list[records.Environment],
    episodes: list[records.Episode],
) -> tuple[np.ndarray, np.ndarray]:
  """R[env, k, hinted] and its mask from played episodes."""
  k = max(
      [config.agent.episodes_per_env, hint_episodes(config)]
      + [ep.sample + 1 for ep in episodes]
  )
  out = np.zeros((max(len(envs), 1), k, 2), np.float32)
  mask = np.zeros_like(out, bool)
  for ep in episodes:
    h = int(ep.hinted)
    out[ep.env_index, ep.sample, h] = ep.episode_return(
        config.agent.return_rule
    )
    # An episode whose environment failed says nothing about the agent or
    # the program's difficulty: it leaves its group.
    mask[ep.env_index, ep.sample, h] = not ep.env_failed
  return out, mask


def score(
    config: ml_collections.ConfigDict,
    designs: list[records.Design],
    envs: list[records.Environment],
    returns_: np.ndarray,
    mask: np.ndarray,
) -> records.Scores:
  """Every score of returns f32[E, K, 2] under `mask` (one jitted call)."""
  valid_env = np.ones((returns_.shape[0],), bool) & (len(envs) > 0)
  design_of_env = np.full((returns_.shape[0],), -1, np.int32)
  for e, env in enumerate(envs):
    if env.design_index is not None:
      design_of_env[e] = env.design_index
  out = jax.device_get(
      regret_scoring.make_scorer(config)(
          returns_,
          mask,
          valid_env,
          design_of_env,
          np.array([d.valid for d in designs], bool),
          np.array([d.group for d in designs], np.int32),
      )
  )
  summary = {
      k: float(out[k])
      for k in ("return_hint", "return_nohint", "regret_mean", "num_episodes")
  }
  return records.Scores(
      returns=returns_,
      mask=mask,
      regret=np.asarray(out["regret"]),
      env_score=np.asarray(out["env_score"]),
      design_reward=np.asarray(out["design_reward"]),
      designer_advantages=np.asarray(out["designer_advantages"]),
      agent_advantages=np.asarray(out["agent_advantages"]),
      summary=summary,
  )


def agent_samples(
    config: ml_collections.ConfigDict,
    episodes: list[records.Episode],
    scores: records.Scores,
) -> tuple[list[list[batching.Row]], int]:
  """The agent's samples in play order, each its rows with signal, and the
  rows there were.

  A sample is one trained episode with a reply (a trajectory, as the
  reference's batch counts them): its one row (`Episode.exact`) or its
  turns' rows, none where it carries no signal. A row whose advantage is 0
  (its group's returns were all equal) adds nothing to the gradient, so it
  is not batched; episodes of a failed environment and, unless
  `agent.train_on_hinted`, hinted episodes are not trained on. Under
  `agent.compact_filter` (the reference's --spade-compact-filter) an episode
  the environment did not terminate (truncated, cut off, out of turns or
  context) counts but carries no loss; its return still counts in its
  group's advantages. A reply marked untrained (`Turn.trained`) carries no
  loss either.
  """
  samples, total = [], 0
  for ep in episodes:
    if ep.env_failed or (ep.hinted and not config.agent.train_on_hinted):
      continue
    a = float(scores.agent_advantages[ep.env_index, ep.sample, int(ep.hinted)])
    if config.agent.compact_filter and not ep.terminated:
      a = 0.0
    if ep.exact and any(t.completion_ids for t in ep.turns):
      # The whole episode as one row: replies unmasked, the environment's
      # words between them masked, scored once.
      total += 1
      rows = []
      if a != 0.0 and any(ep.token_mask[ep.prompt_len :]):
        rows.append(
            batching.Row(
                ep.tokens[: ep.prompt_len],
                ep.tokens[ep.prompt_len :],
                ep.token_logprobs[ep.prompt_len :],
                a,
                mask=ep.token_mask[ep.prompt_len :],
            )
        )
      samples.append(rows)
      continue
    replies = [turn for turn in ep.turns if turn.completion_ids]
    if not replies:
      continue
    total += len(replies)
    samples.append(
        [
            batching.Row(turn.prompt(ep), turn.completion_ids, turn.logprobs, a)
            for turn in replies
            if a != 0.0 and turn.trained
        ]
    )
  return samples, total


def agent_rows(
    config: ml_collections.ConfigDict,
    episodes: list[records.Episode],
    scores: records.Scores,
) -> tuple[list[batching.Row], int]:
  """The agent's update rows with signal, and the rows there were (one an
  exact episode, else one a reply): `agent_samples` unbatched."""
  samples, total = agent_samples(config, episodes, scores)
  return [r for rows in samples for r in rows], total


def compact_filtered(
    config: ml_collections.ConfigDict, episodes: list[records.Episode]
) -> tuple[int, int]:
  """(episodes `agent.compact_filter` keeps out of the update, episodes the
  update could train on): the trainable ones the environment did not
  terminate (`rollout/compact_filtered_count`, `_pct`)."""
  trainable = [
      ep
      for ep in episodes
      if not ep.env_failed and (config.agent.train_on_hinted or not ep.hinted)
  ]
  return sum(not ep.terminated for ep in trainable), len(trainable)


def designer_samples(
    designs: list[records.Design], scores: records.Scores
) -> list[batching.Row | None]:
  """One entry a design, in order: its update row, or None where its
  advantage is 0 (it counts among the batch's samples but is not
  batched)."""
  return [
      batching.Row(d.prompt_ids, d.completion_ids, d.logprobs, float(a))
      if float(a) != 0.0
      else None
      for d, a in zip(designs, scores.designer_advantages)
  ]


def update_rows(
    config: ml_collections.ConfigDict,
    agent: list[list[batching.Row]],
    designer: list[batching.Row | None],
    total: int,
) -> tuple[list[batching.Row], list[batching.Row], int, dict[str, float]]:
  """The update's rows, its loss divisor and the batch's metrics.

  With `optim.global_batch_size` > 0 (under `optim.loss_reduction=
  "sample_mean"`) the batch is the reference's (`batching.shape_batch`):
  the `designer` samples (None: no signal) first, then the `agent`'s
  (`agent_samples`), duplicated or trimmed by copy counts, the loss divided
  by its real samples. With 0, every row once and the loss divided by
  `total`, the rows there were.

  Returns:
    (agent rows, designer rows, the divisor, `update/trimmed_samples`,
    `update/duplicated_samples` and `update/real_samples`).
  """
  o = config.optim
  if o.global_batch_size > 0 and o.loss_reduction == "sample_mean":
    shape = batching.shape_batch(len(designer), len(agent), o.global_batch_size)
    agent_rows = batching.with_copies(agent, shape.agent)
    designer_rows = batching.with_copies(
        [[r] if r is not None else [] for r in designer], shape.designer
    )
    trimmed, duplicated, samples = shape.trimmed, shape.duplicated, shape.real
  else:
    agent_rows = [r for rows in agent for r in rows]
    designer_rows = [r for r in designer if r is not None]
    trimmed, duplicated, samples = 0, 0, total
  return (
      agent_rows,
      designer_rows,
      samples,
      {
          "update/trimmed_samples": float(trimmed),
          "update/duplicated_samples": float(duplicated),
          "update/real_samples": float(samples),
      },
  )


def timed_out(num_envs: int, episodes: list[records.Episode]) -> list[bool]:
  """Per environment: whether one of its episodes ended on an environment
  call that ran past its budget (`rollout.hung`: failure "call_timeout"),
  which `regret_based` scores at `regret.timeout_penalty`."""
  out = [False] * num_envs
  for ep in episodes:
    if rollout.hung(ep):
      out[ep.env_index] = True
  return out


def window_arrays(window: records.Window):
  """The window's plays as `spade.regret.delayed` takes them: unhinted
  returns f32[E, S, K] by step offset with their mask, and the hinted
  returns f32[E, H] of the regeneration step with theirs."""
  n = max(len(window.envs), 1)
  steps = window.steps or [[p[0]] for p in window.plays]
  s = max([len(e) for e in steps] + [1])
  k = max([len(x) for e in steps for x in e] + [1])
  h = max([len(p[1]) for p in window.plays] + [1])
  w = np.zeros((n, s, k), np.float32)
  wmask = np.zeros_like(w, bool)
  hint = np.zeros((n, h), np.float32)
  hmask = np.zeros_like(hint, bool)
  for e, env_steps in enumerate(steps):
    for j, plays in enumerate(env_steps):
      w[e, j, : len(plays)] = plays
      wmask[e, j, : len(plays)] = True
  for e, (_, hinted) in enumerate(window.plays):
    hint[e, : len(hinted)] = hinted
    hmask[e, : len(hinted)] = True
  return w, wmask, hint, hmask


def window_rewards(
    config: ml_collections.ConfigDict,
    window: records.Window,
    scores: records.Scores,
    actor_rows: int,
    lp_state: dict[str, list[float]] | None = None,
) -> tuple[records.Scores, dict[str, list[float]] | None]:
  """The window's designer rewards as the reference computes them.

  With `regret.estimator="reference"`: the raw signal per environment by
  `regret.window_reward` (`spade.regret.delayed`: the blend with
  `regret.timing`, regret_based, micro_lp, solve_rate, learning_potential),
  each design's reward its environment's, centred per skill over the
  designs that are trained (valid, and raw >= 0; with
  `designer.invalid_designs="penalize"` the invalid ones too, at
  `regret.invalid_penalty`), times the weight
  min(actor rows / design rows x interval, `regret.max_env_reward_scale`).
  Other estimators keep the scorer's rewards, with the same weight.
  `lp_state` (skill -> [mu_fast, mu_slow, seen]) is learning_potential's
  state, returned updated.

  Returns:
    (`scores` with design_reward and designer_advantages replaced, the
    learning-potential state).
  """
  c, r = config, config.regret
  designs = window.designs
  n = len(designs)
  interval = c.designer.regeneration_interval
  valid = np.array([d.valid for d in designs], bool)
  scale = delayed.env_reward_scale(
      actor_rows, int(valid.sum()), interval, r.max_env_reward_scale
  )
  if r.estimator != "reference" or not n:
    return (
        dataclasses.replace(
            scores, designer_advantages=scores.designer_advantages * scale
        ),
        lp_state,
    )
  w, wmask, hint, hmask = window_arrays(window)
  plateau = dict(
      plateau_lo=r.plateau_lo,
      plateau_hi=r.plateau_hi,
      plateau_ramp=r.plateau_ramp,
  )
  env_of = {env.design_index: e for e, env in enumerate(window.envs)
            if env.design_index is not None}  # fmt: skip
  skills = sorted({d.skill for d in designs})
  if r.window_reward == "blend":
    raw_env = delayed.blend(
        w, wmask, hint, hmask, timing=r.timing,
        regret_weight=r.regret_weight, regret_scale=r.regret_scale,
        plateau_weight=r.plateau_weight, **plateau,
    )  # fmt: skip
  elif r.window_reward == "regret_based":
    raw_env = delayed.regret_based(
        w, wmask, hint, hmask,
        np.array(window.timed_out or [False] * len(w), bool)[: len(w)],
        timeout_penalty=r.timeout_penalty,
    )  # fmt: skip
  elif r.window_reward == "micro_lp":
    raw_env = delayed.micro_lp(w, wmask)
  elif r.window_reward == "solve_rate":
    raw_env = delayed.solve_rate(w, wmask, **plateau)
  elif r.window_reward == "learning_potential":
    lp_state = dict(lp_state or {})
    env_skill = np.zeros((len(w),), np.int32)
    for i, e in env_of.items():
      env_skill[e] = skills.index(designs[i].skill)
    old = [lp_state.get(s, [0.0, 0.0, 0.0]) for s in skills]
    state = delayed.LPState(
        np.array([o[0] for o in old], np.float32),
        np.array([o[1] for o in old], np.float32),
        np.array([bool(o[2]) for o in old]),
    )
    raw_env, state = delayed.learning_potential(
        w, wmask, env_skill, state,
        gamma_fast=r.lp_gamma_fast, gamma_slow=r.lp_gamma_slow,
    )  # fmt: skip
    state = jax.device_get(state)
    for j, s in enumerate(skills):
      lp_state[s] = [
          float(state.mu_fast[j]), float(state.mu_slow[j]),
          float(state.seen[j]),
      ]  # fmt: skip
  else:
    raise ValueError(
        f"unknown regret.window_reward {r.window_reward!r}; one of"
        f" {delayed.WINDOW_REWARDS}"
    )
  raw_env = np.asarray(jax.device_get(raw_env), np.float32)
  raw = np.full((n,), r.invalid_penalty, np.float32)
  for i, e in env_of.items():
    raw[i] = raw_env[e]
  has_env = np.array([i in env_of for i in range(n)], bool)
  keep = valid & has_env & (raw >= 0)
  if c.designer.invalid_designs == "penalize":
    # Ours: an invalid design stays in its skill's group at
    # regret.invalid_penalty, so its rows are pushed down and its valid
    # neighbours up (the reference's "drop" leaves it out).
    keep = keep | ~valid
  skill_ids = np.array([skills.index(d.skill) for d in designs], np.int32)
  adv = delayed.centre_per_skill(raw, skill_ids, keep, scale)
  return (
      dataclasses.replace(
          scores,
          design_reward=raw,
          designer_advantages=np.asarray(jax.device_get(adv), np.float32),
      ),
      lp_state,
  )
