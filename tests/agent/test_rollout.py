"""The rollout: turns, termination, hints, errors, truncation, overlap."""

import time

import pytest

from spade.agent import episodes as episodes_lib
from spade.agent import prompts
from spade.agent import rollout
from spade.model import tokenizer


class CountEnv:
  """Reach the target by adding; reward 1.0 on hitting it."""

  def __init__(self, seed):
    self.target = 3 + seed % 2
    self.total = 0

  def step(self, action):
    if "boom" in action:
      raise RuntimeError("environment crashed")
    self.total += 1 if "+1" in action else 0
    won = self.total == self.target
    return {
        "ok": True,
        "obs": f"total={self.total}",
        "reward": 1.0 if won else 0.0,
        "terminated": won,
        "truncated": False,
        "info": {},
    }


class FakeExecutor:
  """In-process stand-in for the sandbox, with a per-call delay."""

  def __init__(self, delay=0.0):
    self.envs = {}
    self.delay = delay
    self.closed = []

  def reset(self, items):
    time.sleep(self.delay)
    out = []
    for eid, source, seed, want_hint in items:
      if source == "broken":
        out.append({"ok": False, "reason": "init", "message": "bad"})
        continue
      self.envs[eid] = CountEnv(seed)
      out.append(
          {
              "ok": True,
              "obs": f"reach {self.envs[eid].target}",
              "hint": "always +1" if want_hint else None,
          }
      )
    return out

  def step(self, items):
    time.sleep(self.delay)
    out = []
    for eid, action in items:
      try:
        out.append(self.envs[eid].step(action))
      except RuntimeError as e:
        out.append({"ok": False, "reason": "step", "message": str(e)})
    return out

  def close(self, ids):
    self.closed.extend(ids)


def render(messages):
  text = "".join(m["content"] for m in messages)
  return [ord(ch) % 256 for ch in text]


def hinted_sampler(prompts_ids, seed, keys=None):
  """Plays +1 only when the prompt carries the hint (so hints matter)."""
  del seed, keys
  outs = []
  for ids in prompts_ids:
    text = "".join(chr(i) for i in ids)
    action = "\\boxed{+1}" if "always +1" in text else "\\boxed{wait}"
    outs.append(([1, 2, 3], [-0.5, -0.5, -0.5], action))
  return outs


def test_hint_makes_the_difference():
  specs = []
  for s in range(2):
    specs.append(rollout.EpisodeSpec(0, "src", s, None, s))
    specs.append(rollout.EpisodeSpec(0, "src", s, rollout.ENV_HINT, s))
  executor = FakeExecutor()
  episodes, stats = rollout.run_episodes(
      specs,
      hinted_sampler,
      executor,
      render,
      max_turns=6,
      max_context=10_000,
      seed=0,
  )
  by = {(e.sample, e.hinted): e for e in episodes}
  for s in range(2):
    assert by[s, True].won and by[s, True].episode_return() == 1.0
    assert len(by[s, True].turns) == 3 + s  # target 3 or 4 +1 moves
    assert by[s, True].hint == "always +1"
    assert not by[s, False].won and len(by[s, False].turns) == 6
    assert by[s, False].truncated and not by[s, False].terminated
    assert by[s, False].episode_return() == 0.0
  assert stats.tokens_sampled == 3 * sum(len(e.turns) for e in episodes)
  assert sorted(executor.closed) == [0, 1, 2, 3]


def test_each_prompt_is_keyed_by_its_episode():
  """A batched sampler learns which episode each prompt is: each call
  answers the live episodes of one half, the halves in turn."""
  specs = []
  for s in range(2):
    specs.append(rollout.EpisodeSpec(0, "src", s, None, s))
    specs.append(rollout.EpisodeSpec(0, "src", s, rollout.ENV_HINT, s))
  calls = []

  def sampler(prompts_ids, seed, keys=None):
    calls.append(list(keys))
    return hinted_sampler(prompts_ids, seed, keys)

  episodes, _ = rollout.run_episodes(
      specs, sampler, FakeExecutor(), render, max_turns=6,
      max_context=10_000, seed=0,
  )  # fmt: skip
  assert calls[:2] == [[0, 1], [2, 3]]  # turn 1, one call per half
  for keys in calls:
    assert keys in ([0, 1], [2, 3], [0], [2], [1], [3])
  # An episode is sampled once per turn it played, under its own key.
  for i, ep in enumerate(episodes):
    assert sum(keys.count(i) for keys in calls) == len(ep.turns)


def test_broken_env_and_crash_are_recorded():
  def crasher(prompts_ids, seed, keys=None):
    del seed, keys
    return [([1], [-1.0], "boom")] * len(prompts_ids)

  specs = [
      rollout.EpisodeSpec(0, "broken", 0, None),
      rollout.EpisodeSpec(1, "src", 0, None),
  ]
  episodes, _ = rollout.run_episodes(
      specs,
      crasher,
      FakeExecutor(),
      render,
      max_turns=3,
      max_context=1000,
      seed=0,
  )
  assert episodes[0].error == "init: bad" and not episodes[0].turns
  assert episodes[1].error == "step: environment crashed"
  assert len(episodes[1].turns) == 1
  # Both are the environment's failures, not the agent's: masked later.
  assert episodes[0].env_failed and episodes[1].env_failed


def test_a_hint_too_long_for_the_prompt_fails_its_episode_not_the_run():
  specs = [
      rollout.EpisodeSpec(0, "src", 0, "x" * 5000),  # a junk written hint
      rollout.EpisodeSpec(0, "src", 0, None),
  ]
  episodes, _ = rollout.run_episodes(
      specs,
      hinted_sampler,
      FakeExecutor(),
      render,
      max_turns=2,
      max_context=200,
      seed=0,
  )
  assert episodes[0].env_failed and not episodes[0].turns
  assert episodes[0].error.startswith("prompt: the chat format and hint")
  assert not episodes[1].env_failed and len(episodes[1].turns) == 2


def test_sandbox_time_hides_behind_sampling():
  def slow_sampler(prompts_ids, seed, keys=None):
    time.sleep(0.05)
    return hinted_sampler(prompts_ids, seed, keys)

  specs = [rollout.EpisodeSpec(0, "src", s, None, s) for s in range(8)]
  _, stats = rollout.run_episodes(
      specs,
      slow_sampler,
      FakeExecutor(delay=0.04),
      render,
      max_turns=4,
      max_context=1000,
      seed=0,
  )
  # Two halves: each half's 0.04 s reset or step runs during the other's
  # 0.05 s sampling (all but the first half's resets and the last step), so
  # most sandbox time is hidden.
  assert stats.sandbox_hidden_s > 0.5 * stats.sandbox_s


def test_a_batched_sampler_gets_a_fresh_seed_every_call():
  calls = []

  def counting(prompts_ids, seed, keys=None):
    calls.append((seed, tuple(keys)))
    return hinted_sampler(prompts_ids, seed, keys)

  specs = [rollout.EpisodeSpec(0, "src", s, "always +1", s) for s in range(10)]
  episodes, stats = rollout.run_episodes(
      specs,
      counting,
      FakeExecutor(),
      render,
      max_turns=6,
      max_context=1000,
      seed=7,
  )
  # The halves {0..4} and {5..9} in turn, call n seeded 7000 + n.
  assert [set(k) for _, k in calls[:2]] == [set(range(5)), set(range(5, 10))]
  assert [s for s, _ in calls] == [7000 + n for n in range(len(calls))]
  # Every episode is played as it would be in one call.
  assert all(ep.terminated and ep.total_reward == 1.0 for ep in episodes)
  # A call counts its rows times its longest reply, as a lock-step batch.
  assert (
      stats.decode_row_steps
      == stats.tokens_generated
      == 3 * sum(len(ep.turns) for ep in episodes)
  )


def test_truncation_drops_oldest_turns_but_keeps_task_and_hint():
  turns = [(f"action{i}", f"obs{i}") for i in range(50)]
  messages = prompts.history_messages("TASK", "HINT", turns)
  ids = prompts.truncate_messages(messages, render, 420)
  text = "".join(chr(i) for i in ids)
  assert len(ids) <= 420
  assert "TASK" in text and "HINT" in text
  assert "obs49" in text and "obs0" not in text


class ToolEnv:
  """Adds up tool calls; `<answer>` submits (the reference's tool protocol)."""

  def __init__(self):
    self.total = 0
    self.steps = 0

  def execute_tool(self, name, arguments):
    if name != "add":
      return {"output": f"unknown tool {name}"}
    self.total += int(arguments["n"])
    return {"output": f"total={self.total}"}

  def step(self, action):
    self.steps += 1
    if "raise" in action:
      raise ValueError("the program's own bug")
    won = f"<answer>{self.total}</answer>" in action and self.total == 6
    return {
        "ok": True,
        "obs": "wrong",
        "reward": 1.0 if won else 0.0,
        "terminated": True,
        "truncated": False,
        "info": {},
    }


class ToolExecutor(FakeExecutor):
  """Tool-use environments (`env()` makes each, `ToolEnv` by default);
  `call` runs `execute_tool` as the pool does."""

  def __init__(self, env=ToolEnv, **kw):
    super().__init__(**kw)
    self.env = env

  def reset(self, items):
    out = []
    for eid, _, _, _ in items:
      self.envs[eid] = self.env()
      out.append({"ok": True, "obs": "sum to 6", "hint": None, "tools": True})
    return out

  def step(self, items):
    out = []
    for eid, action in items:
      try:
        out.append(self.envs[eid].step(action))
      except ValueError as e:
        out.append({"ok": False, "reason": "exception", "message": str(e)})
    return out

  def call(self, items):
    return [
        {"ok": True, "value": getattr(self.envs[eid], m)(*args)}
        for eid, m, args in items
    ]


def _scripted(replies):
  """A sampler that plays `replies` in order, one per turn."""
  turn = iter(replies)

  def sample(prompts_ids, seed, keys=None):
    del seed, keys
    text = next(turn)
    return [([7] * len(text), [-0.1] * len(text), text)] * len(prompts_ids)

  return sample


def test_a_reply_with_three_tool_calls_runs_them_all_as_one_turn():
  calls = "".join(
      f'<tool_call>{{"name": "add", "arguments": {{"n": {n}}}}}</tool_call>'
      for n in (1, 2, 3)
  )
  executor = ToolExecutor()
  chat = tokenizer.ByteTokenizer()
  episodes, stats = rollout.run_episodes(
      [rollout.EpisodeSpec(0, "src", 0, None)],
      _scripted([calls, "<answer>6</answer>"]),
      executor,
      lambda m: chat.encode(chat.chat_prompt(m)),
      max_turns=5,
      max_context=10_000,
      seed=0,
  )
  (ep,) = episodes
  assert stats.tool_calls == 3 and len(ep.turns) == 2
  assert ep.turns[0].tool_results == ("total=1", "total=3", "total=6")
  assert ep.turns[0].reward == 0.0 and ep.turns[1].reward == 1.0
  # The tool calls spent none of the environment's step() calls.
  assert executor.envs[0].steps == 1
  assert ep.terminated and ep.episode_return() == 1.0
  # The second reply was sampled after the tool results, as tool messages.
  seen = chat.decode(ep.turns[1].prompt_ids)
  assert (
      "### user\n<tool_response>\ntotal=1\n</tool_response>\n"
      "<tool_response>\ntotal=3\n</tool_response>" in seen
  )


def test_a_step_that_raises_ends_the_episode_with_minus_one():
  episodes, _ = rollout.run_episodes(
      [rollout.EpisodeSpec(0, "src", 0, None)],
      _scripted(["raise please"]),
      ToolExecutor(),
      render,
      max_turns=5,
      max_context=10_000,
      seed=0,
  )
  (ep,) = episodes
  assert not ep.env_failed and ep.terminated
  assert ep.rewards == (-1.0,)
  assert ep.episode_return("final_if_terminated") == -1.0
  # Ours before: the total clipped to [0, 1] erased the penalty.
  assert ep.episode_return("clipped_total") == 0.0


def test_truncated_episode_returns_zero_under_the_reference_rule():
  episodes, _ = rollout.run_episodes(
      [rollout.EpisodeSpec(0, "src", 0, None)],
      _scripted(["\\boxed{+1}"] * 2),
      FakeExecutor(),
      render,
      max_turns=2,
      max_context=10_000,
      seed=0,
  )
  (ep,) = episodes
  assert ep.truncated and not ep.terminated
  assert ep.episode_return() == 0.0


def test_truncation_never_cuts_the_system_message_or_the_hint():
  # A first observation longer than the whole budget: the task text is
  # shortened, the system message and the hint survive intact.
  messages = prompts.history_messages("T" * 5000, "HINT", [], style="system")
  ids = prompts.truncate_messages(messages, render, 600)
  text = "".join(chr(i) for i in ids)
  assert len(ids) <= 600
  assert text.startswith(prompts.AGENT_SYSTEM) and "Hint: HINT" in text


def test_reference_prompt_is_the_reference_actor_template():
  # spade-rl/spade orchestrator.py `_apply_game_template("qwen3_game")` and
  # types.py `hint_injection_template`, character for character.
  messages = prompts.episode_messages("Pick a digit.", "Try 7.", [])
  assert messages == [
      {
          "role": "user",
          "content": (
              "You are playing a language game. Make valid actions to win.\n"
              "Observation: Pick a digit.\n\nHINT: Try 7.\n"
              "Please reason step by step, and put your final answer within"
              " \\boxed{}."
          ),
      }
  ]
  # Later observations are plain user turns.
  turn = episodes_lib.Turn((), (), (), "\\boxed{3}", 0.0, "Wrong.")
  assert prompts.episode_messages("Pick a digit.", None, [turn])[1:] == [
      {"role": "assistant", "content": "\\boxed{3}"},
      {"role": "user", "content": "Wrong."},
  ]
  # A tool-use environment's observation is not wrapped; a system message
  # says how to call tools, as Qwen's template does with tools.
  system, user = prompts.episode_messages("Find order 7.", None, [], tools=True)
  assert user == {"role": "user", "content": "Find order 7."}
  assert "<tool_call>" in system["content"] and system["role"] == "system"
  with pytest.raises(ValueError, match="prompt_style"):
    prompts.episode_messages("x", None, [], style="mine")


def test_truncation_keeps_the_reference_wrapper_and_hint():
  messages = prompts.history_messages("T" * 5000, "HINT", [])
  ids = prompts.truncate_messages(messages, render, 600)
  text = "".join(chr(i) for i in ids)
  assert len(ids) <= 600 and "T" * 100 in text
  assert text.startswith(prompts.GAME_PREFIX + "TTT")
  assert text.endswith("TTT\n\nHINT: HINT" + prompts.GAME_SUFFIX)


def test_prompt_budget_leaves_room_for_the_reply():
  assert prompts.prompt_budget(768, 1024, 32) == 768
  assert prompts.prompt_budget(4096, 1024, 512) == 512
