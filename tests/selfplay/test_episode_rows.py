"""One row per episode scores exactly what its per-turn rows score."""

import types

import jax
import numpy as np
import pytest

from spade import config as config_lib
from spade.agent import rollout
from spade.model import tokenizer as tokenizer_lib
from spade.model import transformer
from spade.selfplay import batching
from spade.selfplay import engine as engine_lib
from spade.train import losses
from spade.train import update as update_lib


class CountExecutor:
  """Reach 3 by replies holding "+1"; reward 1 on reaching it."""

  def __init__(self):
    self.total = {}

  def reset(self, items):
    out = []
    for eid, _, _, _ in items:
      self.total[eid] = 0
      out.append({"ok": True, "obs": "reach 3", "hint": None})
    return out

  def step(self, items):
    out = []
    for eid, action in items:
      self.total[eid] += 1 if "+1" in action else 0
      won = self.total[eid] == 3
      out.append(
          {
              "ok": True,
              "obs": f"total={self.total[eid]}",
              "reward": float(won),
              "terminated": won,
              "truncated": False,
              "info": {},
          }
      )
    return out

  def close(self, ids):
    del ids


def _episode():
  """A 4-turn episode played with scripted replies and the byte chat format."""
  tok = tokenizer_lib.ByteTokenizer()
  # Engine.extend needs only the tokenizer.
  fake_engine = types.SimpleNamespace(tokenizer=tok)
  extend = lambda *a: engine_lib.Engine.extend(fake_engine, *a)
  render = lambda m: tok.encode(tok.chat_prompt(m), add_bos=True)
  replies = iter(["\\boxed{+1}", "\\boxed{wait}", "\\boxed{+1}", "\\boxed{+1}"])

  def sampler(prompts, seed, keys=None):
    del seed, keys
    text = next(replies)
    ids = tok.encode(text) + [tok.eos_id]
    return [(ids, [-0.5] * len(ids), text) for _ in prompts]

  (ep,), _ = rollout.run_episodes(
      [rollout.EpisodeSpec(0, "src", 0, None)],
      sampler,
      CountExecutor(),
      render,
      max_turns=6,
      max_context=4096,
      seed=0,
      extend=extend,
      stop_ids=tok.stop_ids,
  )
  return ep


def test_the_sequence_is_what_the_sampler_saw_turn_by_turn():
  ep = _episode()
  assert ep.exact and len(ep.turns) == 4 and ep.won
  for i, turn in enumerate(ep.turns):
    prompt = turn.prompt(ep)
    # Each reply was sampled from the sequence so far, and follows it.
    n = len(prompt)
    assert ep.tokens[n : n + len(turn.completion_ids)] == turn.completion_ids
    if i + 1 < len(ep.turns):
      assert ep.turns[i + 1].prompt(ep)[:n] == prompt
  assert sum(ep.token_mask) == sum(len(t.completion_ids) for t in ep.turns)


@pytest.mark.slow
def test_one_episode_row_scores_like_its_per_turn_rows():
  ep = _episode()
  config = config_lib.base_config()
  model = transformer.build_model(config.model)
  params = transformer.init_params(config.model, jax.random.PRNGKey(0))
  episode_row = batching.Row(
      ep.tokens[: ep.prompt_len],
      ep.tokens[ep.prompt_len :],
      ep.token_logprobs[ep.prompt_len :],
      1.0,
      mask=ep.token_mask[ep.prompt_len :],
  )
  turn_rows = [
      batching.Row(t.prompt(ep), t.completion_ids, t.logprobs, 1.0)
      for t in ep.turns
  ]

  def scored(rows):
    batch = batching.make_batch(rows, max_len=1024, pad_id=0)
    logp = update_lib._logprobs(  # pylint: disable=protected-access
        model, params, batch, transformer.Role.AGENT
    )
    logp = np.asarray(logp)
    picked = [logp[i][batch["loss_mask"][i]] for i in range(len(rows))]
    loss, _ = losses.policy_loss(
        logp,
        batch["old_logprobs"],
        batch["advantages"],
        batch["loss_mask"],
        batch["weights"],
        clip_low=0.2,
        clip_high=0.28,
    )
    return np.concatenate(picked), float(loss)

  one, one_loss = scored([episode_row])
  per_turn, turn_loss = scored(turn_rows)
  assert one.shape == per_turn.shape == (sum(ep.token_mask),)
  np.testing.assert_allclose(one, per_turn, atol=2e-5)
  np.testing.assert_allclose(one_loss, turn_loss, rtol=1e-5)
  # The point: the episode row scores each history token once.
  tokens_one = len(episode_row.prompt_ids) + len(episode_row.completion_ids)
  tokens_turns = sum(
      len(r.prompt_ids) + len(r.completion_ids) for r in turn_rows
  )
  assert tokens_one < tokens_turns / 2
