r"""The reference's episode rules: what step() receives, no EOS, full context."""

import pytest

from spade.agent import actions
from spade.agent import rollout


class RecordingEnv:
  """Wins when it receives exactly `\boxed{7}`; records every action."""

  def __init__(self):
    self.actions = []

  def step(self, action):
    self.actions.append(action)
    won = action == "\\boxed{7}"
    return {
        "ok": True,
        "obs": "x" * 40,  # a long observation fills small contexts
        "reward": 1.0 if won else 0.0,
        "terminated": won,
        "truncated": False,
        "info": {},
    }


class Executor:

  def __init__(self):
    self.envs = {}

  def reset(self, items):
    self.envs = {eid: RecordingEnv() for eid, *_ in items}
    return [{"ok": True, "obs": "guess", "hint": None} for _ in items]

  def step(self, items):
    return [self.envs[eid].step(a) for eid, a in items]

  def call(self, items):
    raise AssertionError("no tools here")

  def close(self, ids):
    del ids


def render(messages):
  return [ord(c) % 256 for m in messages for c in m["content"]]


EOS = 999


def scripted(replies, eos=True):
  """A sampler that answers the n-th call with replies[n]."""
  calls = []

  def sample(prompts_ids, seed, keys=None):
    del seed, keys
    text = replies[min(len(calls), len(replies) - 1)]
    calls.append(len(prompts_ids))
    tokens = [5, 6] + ([EOS] if eos else [])
    return [(tokens, [-0.1] * len(tokens), text) for _ in prompts_ids]

  sample.calls = calls
  return sample


def _play(sampler, executor, hint=None, **kw):
  spec = rollout.EpisodeSpec(0, "src", 0, hint, 0)
  kw.setdefault("max_context", 10_000)
  episodes, _ = rollout.run_episodes(
      [spec], sampler, executor, render, max_turns=4, seed=0,
      stop_ids=(EOS,), **kw,
  )  # fmt: skip
  return episodes[0]


def test_parse_action_is_the_references():
  assert actions.parse_action("I think \\boxed{ 7 } then \\boxed{8}") == (
      "\\boxed{7}"
  )
  assert actions.parse_action("  no box here \n") == "no box here"
  assert actions.parse_action("\\boxed{{3}}") == "\\boxed{3}"
  # Nested braces: the last \boxed, balanced, outer braces peeled.
  assert (
      actions.parse_action("\\boxed{\\frac{1}{2}}") == "\\boxed{\\frac{1}{2}}"
  )
  assert actions.parse_action(" <answer>\\boxed{1}</answer> ", tools=True) == (
      "<answer>\\boxed{1}</answer>"
  )
  assert actions.step_action(" a \\boxed{1}", rule="raw") == " a \\boxed{1}"
  with pytest.raises(ValueError, match="config.agent.action"):
    actions.step_action("x", rule="boxed")


def test_step_receives_the_boxed_answer():
  executor = Executor()
  ep = _play(scripted(["Let me think... so \\boxed{7}. Done!"]), executor)
  assert executor.envs[0].actions == ["\\boxed{7}"]
  assert ep.terminated and ep.episode_return() == 1.0
  # Ours: the whole reply, which this environment does not accept.
  executor = Executor()
  ep = _play(scripted(["so \\boxed{7}."]), executor, action_rule="raw")
  assert executor.envs[0].actions == ["so \\boxed{7}."] * 4
  assert not ep.terminated and ep.episode_return() == 0.0


def test_a_reply_without_eos_ends_the_episode_with_no_step():
  executor = Executor()
  ep = _play(scripted(["\\boxed{7}"], eos=False), executor)
  assert executor.envs[0].actions == []  # never stepped
  assert len(ep.turns) == 1 and ep.truncated and not ep.terminated
  assert ep.episode_return() == 0.0
  # The cut reply is still part of the episode's tokens.
  assert ep.turns[0].completion_ids == (5, 6)
  # Ours: the cut reply is stepped.
  executor = Executor()
  ep = _play(
      scripted(["\\boxed{7}"], eos=False), executor, unfinished_reply="step"
  )
  assert executor.envs[0].actions == ["\\boxed{7}"] and ep.terminated


def test_a_hinted_reply_without_eos_is_stepped():
  # The reference's hinted plays (`_play_game_with_hint_async`) step every
  # reply, EOS or not.
  executor = Executor()
  ep = _play(scripted(["\\boxed{7}"], eos=False), executor, hint="Say 7.")
  assert executor.envs[0].actions == ["\\boxed{7}"] and ep.terminated
  executor = Executor()
  ep = _play(
      scripted(["\\boxed{7}"], eos=False), executor, hint="Say 7.",
      hinted_unfinished_reply="end",
  )  # fmt: skip
  assert executor.envs[0].actions == [] and not ep.terminated


def test_a_full_context_ends_the_episode():
  # The task prompt is 144 tokens; the second turn's adds the reply and a
  # 40-character observation.
  sampler = scripted(["\\boxed{1}"])
  ep = _play(sampler, Executor(), max_context=150)
  assert len(ep.turns) == 1 and ep.truncated and not ep.terminated
  assert sampler.calls == [1]
  # Ours: the oldest exchanges are dropped and the episode goes on.
  sampler = scripted(["\\boxed{1}"])
  ep = _play(sampler, Executor(), max_context=150, full_context="drop_oldest")
  assert len(ep.turns) == 4 and sampler.calls == [1, 1, 1, 1]


def test_unhinted_plays_fill_the_reference_batch():
  assert rollout.unhinted_plays(24, 192, 16) == 8
  assert rollout.unhinted_plays(20, 192, 16) == 10  # ceil(9.6)
  assert rollout.unhinted_plays(1, 192, 16) == 192
  assert rollout.unhinted_plays(5, 0, 16) == 16  # the fixed K
  assert rollout.unhinted_plays(0, 192, 16) == 16
