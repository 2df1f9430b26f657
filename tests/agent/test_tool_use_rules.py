"""The reference's tool-use recipe rules: malformed tool calls are masked
(SPADE_MASK_MALFORMED_TOOLCALL=1) and episodes that did not terminate carry
no loss (--spade-compact-filter)."""

import types

import numpy as np

from configs import reference_recipe
from spade import config as config_lib
from spade.agent import episodes as episodes_lib
from spade.agent import rollout
from spade.selfplay import score
from tests.agent import test_rollout

EOS = 999
MALFORMED = '<tool_call>{"name": "lookup", "arguments": {"id": </tool_call>'
CALL = '<tool_call>{"name": "lookup", "arguments": {"id": "7"}}</tool_call>'


class ToolEnv:
  """A tool-use task: wins on `<answer>7</answer>`; records what it gets."""

  def __init__(self):
    self.actions, self.calls = [], []

  def execute_tool(self, name, arguments):
    self.calls.append((name, arguments))
    return {"output": "7"}

  def step(self, action):
    self.actions.append(action)
    won = "<answer>7</answer>" in action
    return {
        "ok": True,
        "obs": "Use a tool.",
        "reward": 1.0 if won else 0.0,
        "terminated": won,
        "truncated": False,
        "info": {},
    }


def render(messages):
  return [ord(c) % 256 for m in messages for c in m["content"]]


def scripted(replies):
  """The n-th call answers replies[n], each reply 3 tokens ending on EOS."""
  calls = []

  def sample(prompts_ids, seed, keys=None):
    del seed, keys
    text = replies[min(len(calls), len(replies) - 1)]
    calls.append(text)
    return [([len(calls), 6, EOS], [-0.1] * 3, text) for _ in prompts_ids]

  return sample


def play(mask, exact):
  executor = test_rollout.ToolExecutor(env=ToolEnv)
  episodes, stats = rollout.run_episodes(
      [rollout.EpisodeSpec(0, "src", 0, None, 0)],
      scripted([MALFORMED, CALL, "<answer>7</answer>"]),
      executor,
      render,
      max_turns=4,
      max_context=10_000,
      seed=0,
      stop_ids=(EOS,),
      extend=(lambda before, reply, after: [1, 2]) if exact else None,
      mask_malformed_tool_calls=mask,
  )
  return episodes[0], stats, executor.envs[0]


def test_malformed_tool_call_is_detected_only_when_unparsable():
  assert rollout.malformed_tool_call(MALFORMED, True)
  assert not rollout.malformed_tool_call(CALL, True)
  assert not rollout.malformed_tool_call(MALFORMED, False)  # a game
  assert not rollout.malformed_tool_call(MALFORMED + "<answer>7</answer>", True)
  assert not rollout.malformed_tool_call("no call at all", True)


def test_a_malformed_tool_call_is_stepped_masked_and_noted():
  for exact in (False, True):
    ep, stats, env = play(mask=True, exact=exact)
    # Stepped with the raw reply; the next reply's call ran as a tool.
    assert env.actions[0] == MALFORMED.strip()
    assert env.calls == [("lookup", {"id": "7"})]
    assert ep.terminated and ep.episode_return() == 1.0
    assert [t.trained for t in ep.turns] == [False, True, True]
    assert ep.turns[0].observation == (
        "Use a tool." + rollout.MALFORMED_TOOL_CALL_NOTE
    )
    assert stats.malformed_tool_calls == 1
    if exact:
      assert ep.exact
      # The first reply's tokens (1, 6, EOS) carry no loss, later ones do.
      sampled = [
          t for t, m in zip(ep.tokens, ep.token_mask) if m
      ]  # fmt: skip
      assert sampled == [2, 6, EOS, 3, 6, EOS]


def test_without_the_mask_a_malformed_call_trains_and_gets_no_note():
  ep, stats, _ = play(mask=False, exact=False)
  assert [t.trained for t in ep.turns] == [True, True, True]
  assert ep.turns[0].observation == "Use a tool."
  assert stats.malformed_tool_calls == 1


def _episode(env_index, sample, terminated, turns=1):
  turn = episodes_lib.Turn((1, 2), (3, EOS), (-0.1, -0.1), "a", 0.0, "o")
  return episodes_lib.Episode(
      env_index=env_index,
      sample=sample,
      hinted=False,
      seed=0,
      hint=None,
      first_observation="o",
      turns=(turn,) * turns,
      terminated=terminated,
      truncated=not terminated,
  )


def test_compact_filter_drops_episodes_not_terminated_from_the_update():
  c = config_lib.base_config()
  eps = [_episode(0, 0, True), _episode(0, 1, False, turns=2)]
  adv = np.zeros((1, 2, 2), np.float32)
  adv[0, 0, 0], adv[0, 1, 0] = 1.0, -1.0
  scores = types.SimpleNamespace(agent_advantages=adv)
  rows, total = score.agent_rows(c, eps, scores)
  assert len(rows) == 3 and total == 3  # off: every turn trains
  c.agent.compact_filter = True
  rows, total = score.agent_rows(c, eps, scores)
  # The truncated episode counts, and its 2 turns carry no loss.
  assert [r.advantage for r in rows] == [1.0] and total == 3
  assert score.compact_filtered(c, eps) == (1, 2)


def test_the_tool_use_recipe_turns_both_on_and_the_games_recipe_neither():
  games = reference_recipe.get_config()
  tools = reference_recipe.get_config("tool_use")
  assert not games.agent.mask_malformed_tool_calls
  assert not games.agent.compact_filter
  assert tools.agent.mask_malformed_tool_calls and tools.agent.compact_filter
