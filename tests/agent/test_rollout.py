"""The rollout engine: turns, termination, hints, errors, truncation, overlap."""

import time

from spade.agent import prompts
from spade.agent import rollout


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


def hinted_sampler(prompts_ids, seed):
  """Plays +1 only when the prompt carries the hint (so hints matter)."""
  del seed
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
  by = {(e.spec.sample, e.spec.hinted): e for e in episodes}
  for s in range(2):
    assert by[s, True].won and by[s, True].episode_return == 1.0
    assert len(by[s, True].turns) == 3 + s  # target 3 or 4 +1 moves
    assert by[s, True].hint == "always +1"
    assert not by[s, False].won and len(by[s, False].turns) == 6
    assert by[s, False].episode_return == 0.0
  assert stats.tokens_sampled == 3 * sum(len(e.turns) for e in episodes)
  assert sorted(executor.closed) == [0, 1, 2, 3]


def test_broken_env_and_crash_are_recorded():
  def crasher(prompts_ids, seed):
    del seed
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


def test_sandbox_time_hides_behind_sampling():
  def slow_sampler(prompts_ids, seed):
    time.sleep(0.05)
    return hinted_sampler(prompts_ids, seed)

  specs = [rollout.EpisodeSpec(0, "src", s, None, s) for s in range(8)]
  _, stats = rollout.run_episodes(
      specs,
      slow_sampler,
      FakeExecutor(delay=0.04),
      render,
      max_turns=4,
      max_context=1000,
      seed=0,
      overlap=True,
  )
  # Two groups: each group's 0.04 s reset or step runs during the other's
  # 0.05 s sampling (all but group 0's resets and the last step), so most
  # sandbox time is hidden.
  assert stats.sandbox_hidden_s > 0.5 * stats.sandbox_s


def test_truncation_drops_oldest_turns_but_keeps_task_and_hint():
  turns = [(f"action{i}", f"obs{i}") for i in range(50)]
  messages = prompts.history_messages("TASK", "HINT", turns)
  ids = prompts.truncate_messages(messages, render, 420)
  text = "".join(chr(i) for i in ids)
  assert len(ids) <= 420
  assert "TASK" in text and "HINT" in text
  assert "obs49" in text and "obs0" not in text
