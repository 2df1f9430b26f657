"""Score: returns R[env, k, hinted] -> `Scores` -> the update's rows.

`returns` reads played episodes into arrays (a window appends them as its
next step, `records.Window.with_plays`), `score` computes every score the
iteration needs from the window's arrays (one jitted call,
`spade.regret.scoring.make_iteration_scorer`: the agent's advantages of this
iteration's plays; regret, designer rewards and, when the window closes,
its registered window reward over every play of the window),
`agent_samples` and `designer_samples` keep the rows that carry signal
(advantage != 0) in the samples they belong to, and `update_rows` shapes
them into the update's batch (`optim.global_batch_size`).
"""

from __future__ import annotations

from typing import Any

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
    window: records.Window,
    lp: Any,
    closes: bool,
) -> tuple[records.Scores, Any]:
  """Every score the iteration needs, in one jitted call over the window's
  plays (its last step this iteration's): see
  `spade.regret.scoring.make_iteration_scorer`.

  `lp` is the loop's learning-potential trackers
  (`state.LearningPotential`), returned updated when the closing window's
  reward is learning_potential.
  """
  envs, designs = window.envs, window.designs
  n = window.returns.shape[0]
  design_of_env = np.full((n,), -1, np.int32)
  for e, env in enumerate(envs):
    if env.design_index is not None:
      design_of_env[e] = env.design_index
  skills = sorted({d.skill for d in designs})
  scorer = regret_scoring.make_iteration_scorer(
      config, closes=closes and bool(designs)
  )
  out, tracked = jax.device_get(
      scorer(
          window.returns,
          window.mask,
          window.timed_out,
          np.ones((n,), bool) & (len(envs) > 0),
          design_of_env,
          np.array([d.valid for d in designs], bool),
          np.array([d.group for d in designs], np.int32),
          np.array([skills.index(d.skill) for d in designs], np.int32),
          lp.take(skills),
          width=window.widths[-1],
      )
  )
  keys = ("return_hint", "return_nohint", "regret_mean", "num_episodes")
  returns, mask = window.last_step()
  scores = records.Scores(
      returns=returns,
      mask=mask,
      agent_advantages=np.asarray(out["agent_advantages"]),
      now={k: float(out["now"][k]) for k in keys},
      regret=np.asarray(out["regret"]),
      env_score=np.asarray(out["env_score"]),
      design_reward=np.asarray(out["design_reward"]),
      designer_advantages=np.asarray(out["designer_advantages"]),
      summary={k: float(out["summary"][k]) for k in keys},
  )
  r = config.regret
  if (
      closes
      and designs
      and r.estimator == "reference"
      and r.window_reward == "learning_potential"
  ):
    lp = lp.put(skills, tracked)
  return scores, lp


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


def compact_metrics(
    config: ml_collections.ConfigDict, episodes: list[records.Episode]
) -> dict[str, float]:
  """`rollout/compact_filtered_count` and `_pct` under
  `agent.compact_filter` (`compact_filtered`); none without it."""
  if not config.agent.compact_filter:
    return {}
  filtered, trainable = compact_filtered(config, episodes)
  return {
      "rollout/compact_filtered_count": float(filtered),
      "rollout/compact_filtered_pct": filtered / max(trainable, 1),
  }


def designer_advantages(
    config: ml_collections.ConfigDict,
    window: records.Window,
    scores: records.Scores,
    actor_rows: int,
) -> np.ndarray:
  """The closing `window`'s designer advantages f32[N], weighted by
  min(actor rows / valid designs x interval, `regret.max_env_reward_scale`)
  (`delayed.env_reward_scale`), the reference's weight of the designer's
  rows against the agent's."""
  scale = delayed.env_reward_scale(
      actor_rows,
      sum(d.valid for d in window.designs),
      config.designer.regeneration_interval,
      config.regret.max_env_reward_scale,
  )
  return scores.designer_advantages * scale


def keeps_unsignalled_designs(config: ml_collections.ConfigDict) -> bool:
  """Whether designs whose advantage is 0 are update rows too: under
  `optim.designer_kl_coef` > 0 (ours) their KL to the reference still pulls
  the designer back, and a designer whose every design broke (all invalid,
  every advantage 0) is pulled back only through them. Not where the
  designer's loss weighs 0 (a frozen designer): rows without a gradient
  would only make updates run on Adam's momentum alone."""
  o = config.optim
  return o.get("designer_kl_coef", 0.0) > 0 and o.designer_loss_weight != 0


def designer_samples(
    config: ml_collections.ConfigDict,
    window: records.Window,
    scores: records.Scores,
    actor_rows: int,
) -> list[batching.Row | None]:
  """One entry a design of the closing `window`, in order: its update row
  with its weighted advantage (`designer_advantages`), or None where that
  is 0 (it counts among the batch's samples but is not batched) and no
  KL term weighs the designer's rows (`keeps_unsignalled_designs`)."""
  keep = keeps_unsignalled_designs(config)
  return [
      batching.Row(d.prompt_ids, d.completion_ids, d.logprobs, float(a))
      if float(a) != 0.0 or keep
      else None
      for d, a in zip(
          window.designs,
          designer_advantages(config, window, scores, actor_rows),
      )
  ]


def top_up_samples(
    config: ml_collections.ConfigDict,
    designs: list[records.Design],
    timed_out: list[bool],
    actor_rows: int,
) -> tuple[list[batching.Row | None], np.ndarray]:
  """The rows of the designs that topped up an open window this iteration
  (`designer.top_up`), one entry a design as `designer_samples` gives them,
  and their raw rewards f32[N].

  The reference scores a top-up when it is generated and never again: a
  non-regeneration rollout reads `_cached_regret` (spade/core/
  orchestrator.py lines 2498-2501), empty in the orchestrator the slime
  rollout builds anew each rollout (lines 199-202) and holding no top-up's
  game in any case, and its delayed recompute finds that epoch's plays
  already popped by the regeneration batch's own (spade/slime/
  spade_rollout.py lines 587-597). So the raw reward is
  `regret.timeout_penalty` where a step() of its environment ran past its
  budget this iteration, else 0 (`assign_env_rewards_regret`, spade/core/
  utils/env_rewards.py lines 200-210), centred per skill among this
  iteration's top-ups (`_center_skill_rewards`, lines 23-37) and weighted
  by `delayed.env_reward_scale` over them (orchestrator.py lines
  2470-2478). A design still invalid gets `regret.invalid_penalty`, in its
  skill's centring only under `designer.invalid_designs="penalize"`, as a
  window's invalid designs.

  `timed_out` is this iteration's flag per environment of the window, whose
  last environments are the valid top-ups in order (`Window.with_envs`).
  """
  if not designs:
    return [], np.zeros((0,), np.float32)
  r = config.regret
  valid = np.array([d.valid for d in designs], bool)
  hung = np.asarray(timed_out, bool)[len(timed_out) - int(valid.sum()) :]
  raw = np.full((len(designs),), r.invalid_penalty, np.float32)
  raw[valid] = np.where(hung, r.timeout_penalty, 0.0)
  keep = valid | (config.designer.invalid_designs == "penalize")
  scale = delayed.env_reward_scale(
      actor_rows,
      int(valid.sum()),
      config.designer.regeneration_interval,
      r.max_env_reward_scale,
  )
  group = np.array([d.group for d in designs], np.int32)
  advantages = np.asarray(delayed.centre_per_skill(raw, group, keep, scale))
  keep_all = keeps_unsignalled_designs(config)
  rows = [
      batching.Row(d.prompt_ids, d.completion_ids, d.logprobs, float(a))
      if float(a) != 0.0 or keep_all
      else None
      for d, a in zip(designs, advantages)
  ]
  return rows, raw


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
