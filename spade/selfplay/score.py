"""Score: returns R[env, k, hinted] -> `Scores` -> the update's rows.

`returns` reads played episodes into arrays, `score` computes every score
from arrays (one jitted call, `spade.regret.scoring`), and `agent_rows` and
`designer_rows` keep the rows that carry signal (advantage != 0).
"""

from __future__ import annotations

import jax
import ml_collections
import numpy as np

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


def agent_rows(
    config: ml_collections.ConfigDict,
    episodes: list[records.Episode],
    scores: records.Scores,
) -> tuple[list[batching.Row], int]:
  """The agent's update rows with signal, and the rows there were.

  A row whose advantage is 0 (its group's returns were all equal) adds
  nothing to the gradient, so it is not batched; episodes of a failed
  environment and, unless `agent.train_on_hinted`, hinted episodes are not
  trained on.
  """
  rows, total = [], 0
  for ep in episodes:
    if ep.env_failed or (ep.hinted and not config.agent.train_on_hinted):
      continue
    a = float(scores.agent_advantages[ep.env_index, ep.sample, int(ep.hinted)])
    if ep.exact and any(t.completion_ids for t in ep.turns):
      # The whole episode as one row: replies unmasked, the environment's
      # words between them masked, scored once.
      total += 1
      if a != 0.0:
        rows.append(
            batching.Row(
                ep.tokens[: ep.prompt_len],
                ep.tokens[ep.prompt_len :],
                ep.token_logprobs[ep.prompt_len :],
                a,
                mask=ep.token_mask[ep.prompt_len :],
            )
        )
      continue
    for turn in ep.turns:
      if not turn.completion_ids:
        continue
      total += 1
      if a != 0.0:
        rows.append(
            batching.Row(turn.prompt(ep), turn.completion_ids, turn.logprobs, a)
        )
  return rows, total


def designer_rows(
    designs: list[records.Design], scores: records.Scores
) -> tuple[list[batching.Row], int]:
  """The designer's update rows with signal, and the rows there were."""
  rows = [
      batching.Row(d.prompt_ids, d.completion_ids, d.logprobs, float(a))
      for d, a in zip(designs, scores.designer_advantages)
      if float(a) != 0.0
  ]
  return rows, len(designs)
