"""Seed environment (planning): measure an exact amount with two jugs."""

import collections
import math
import random
import re


def _boxed(action):
  found = re.findall(r"\\boxed\{([^{}]*)\}", action)
  return " ".join(found[-1].lower().split()) if found else None


class WaterJugsEnv:
  """Two jugs without markings must measure an exact amount of water.

  Each turn fill a jug, empty a jug, or pour one into the other until it is
  full or empty. The budget is the fewest actions plus two.
  """

  def __init__(self, max_turns=20, **kwargs):
    self.max_turns = max_turns
    self.reset()

  def _do(self, state, act):
    a, b = state
    ca, cb = self._caps
    if act == "fill a":
      return ca, b
    if act == "fill b":
      return a, cb
    if act == "empty a":
      return 0, b
    if act == "empty b":
      return a, 0
    if act == "pour a b":
      t = min(a, cb - b)
      return a - t, b + t
    if act == "pour b a":
      t = min(b, ca - a)
      return a + t, b - t
    return None

  _ACTS = ["fill a", "fill b", "empty a", "empty b", "pour a b", "pour b a"]

  def _solve(self, start):
    prev = {start: None}
    queue = collections.deque([start])
    while queue:
      s = queue.popleft()
      if self._goal in s:
        plan = []
        while prev[s] is not None:
          s, act = prev[s]
          plan.append(act)
        return plan[::-1]
      for act in self._ACTS:
        n = self._do(s, act)
        if n not in prev:
          prev[n] = (s, act)
          queue.append(n)
    return None

  def reset(self, seed=None):
    rng = random.Random(seed)
    while True:
      ca, cb = rng.sample(range(3, 14), 2)
      goal = rng.randint(1, max(ca, cb) - 1)
      if math.gcd(ca, cb) != 1 or goal in (ca, cb):
        continue
      self._caps, self._goal = (ca, cb), goal
      plan = self._solve((0, 0))
      if plan and len(plan) >= 4:
        break
    self._state = (0, 0)
    self._budget = len(plan) + 2
    self._used = 0
    self.turn_count = 0
    self._done = False
    return (
        f"Water jugs. Jug A holds {ca} litres, jug B holds {cb}. Both are"
        f" empty. Get exactly {goal} litres in one jug. Actions:"
        " \\boxed{fill a}, \\boxed{empty b}, \\boxed{pour a b} (pour A into"
        f" B) and the like. You have {self._budget} actions."
    ), {}

  def step(self, action):
    if self._done:
      return "The game is over.", 0.0, True, False, {}
    self.turn_count += 1
    act = _boxed(action)
    n = self._do(self._state, act) if act else None
    if n is None:
      msg = "Unknown action; use fill/empty a|b or pour a b / pour b a."
    else:
      self._used += 1
      self._state = n
      msg = f"A={n[0]} B={n[1]}."
      if self._goal in n:
        self._done = True
        return f"{msg} Exactly {self._goal} litres!", 1.0, True, False, {}
      if self._used >= self._budget:
        self._done = True
        return f"{msg} No actions left.", 0.0, True, False, {}
    if self.turn_count >= self.max_turns:
      self._done = True
      return f"{msg} Out of turns.", 0.0, False, True, {}
    return (
        f"{msg} Goal {self._goal}. Actions left: {self._budget - self._used}.",
        0.0,
        False,
        False,
        {},
    )

  def hint(self):
    return f"A shortest plan starts with '{self._solve(self._state)[0]}'."

  def solution(self):
    return [f"\\boxed{{{a}}}" for a in self._solve(self._state)]

  def close(self):
    pass
