"""Seed environment (causal): locate the broken stage of a signal chain."""

import random
import re


def _boxed(action):
  found = re.findall(r"\\boxed\{([^{}]*)\}", action)
  return " ".join(found[-1].lower().split()) if found else None


class FaultyComponentEnv:
  """A signal passes through 16 stages in series; exactly one is broken.

  Probing after stage k tells whether the signal still arrives there.
  Replace the broken stage to win; five turns in all, and replacing a good
  stage loses.
  """

  def __init__(self, max_turns=5, **kwargs):
    self.max_turns = max_turns
    self.reset()

  def reset(self, seed=None):
    rng = random.Random(seed)
    self._n = 16
    self._bad = rng.randint(1, self._n)
    self._log = []
    self.turn_count = 0
    self._done = False
    return (
        f"Signal chain. Stages 1-{self._n} are wired in series and one is"
        " broken. \\boxed{probe 7} tells whether the signal survives stages"
        " 1-7; \\boxed{replace 9} replaces stage 9. Fix the chain within"
        f" {self.max_turns} turns; replacing a good stage loses."
    ), {}

  def step(self, action):
    if self._done:
      return "The game is over.", 0.0, True, False, {}
    self.turn_count += 1
    cmd = (_boxed(action) or "").split()
    if len(cmd) == 2 and cmd[1].isdigit() and 1 <= int(cmd[1]) <= self._n:
      k = int(cmd[1])
      if cmd[0] == "probe":
        ok = k < self._bad
        self._log.append(f"after {k}: {'signal' if ok else 'no signal'}")
        msg = f"Probe after stage {k}: {'signal' if ok else 'no signal'}."
      elif cmd[0] == "replace":
        self._done = True
        if k == self._bad:
          return f"Stage {k} was broken. Fixed!", 1.0, True, False, {}
        return f"Stage {k} was fine; it was {self._bad}.", 0.0, True, False, {}
      else:
        msg = "Reply \\boxed{probe K} or \\boxed{replace K}."
    else:
      msg = (
          f"Reply \\boxed{{probe K}} or \\boxed{{replace K}}, K in 1-{self._n}."
      )
    if self.turn_count >= self.max_turns:
      self._done = True
      return f"{msg} Out of turns.", 0.0, False, True, {}
    return (
        f"{msg} Probes: {'; '.join(self._log)}. Turns left:"
        f" {self.max_turns - self.turn_count}.",
        0.0,
        False,
        False,
        {},
    )

  def hint(self):
    half = "first" if self._bad <= self._n // 2 else "second"
    return f"The broken stage is in the {half} half."

  def solution(self):
    lo, hi, plan = 1, self._n, []
    while lo < hi:
      mid = (lo + hi) // 2
      plan.append(f"\\boxed{{probe {mid}}}")
      if mid < self._bad:
        lo = mid + 1
      else:
        hi = mid
    return plan + [f"\\boxed{{replace {lo}}}"]

  def close(self):
    pass
