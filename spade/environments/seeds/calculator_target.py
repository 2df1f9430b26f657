"""Seed environment (arithmetic): reach a target with a few calculator keys."""

import collections
import random
import re


def _boxed(action):
  found = re.findall(r"\\boxed\{([^{}]*)\}", action)
  return found[-1].replace(" ", "") if found else None


def _press(value, key):
  op, n = key[0], int(key[1:])
  return {"+": value + n, "-": value - n, "*": value * n}[op]


class CalculatorTargetEnv:
  """A calculator with three keys must turn its start value into a target.

  Each turn press one key (such as +7, *3 or -4). The number of presses is
  limited to two more than the shortest way, so keys must be planned.
  """

  def __init__(self, max_turns=10, **kwargs):
    self.max_turns = max_turns
    self.reset()

  def _shortest(self):
    seen = {self._start: []}
    queue = collections.deque([self._start])
    while queue:
      v = queue.popleft()
      if v == self._target:
        return seen[v]
      if len(seen[v]) >= 8:
        continue
      for k in self._keys:
        w = _press(v, k)
        if w not in seen and abs(w) < 10_000:
          seen[w] = seen[v] + [k]
          queue.append(w)
    return None

  def reset(self, seed=None):
    rng = random.Random(seed)
    while True:
      self._keys = [
          f"+{rng.randint(2, 9)}",
          f"*{rng.randint(2, 4)}",
          f"-{rng.randint(1, 9)}",
      ]
      self._start = rng.randint(1, 9)
      v = self._start
      for _ in range(rng.randint(4, 6)):
        v = _press(v, rng.choice(self._keys))
      self._target = v
      path = self._shortest() if v != self._start else None
      if path and len(path) >= 3:
        break
    self._plan = path
    self._budget = len(path) + 2
    self._value = self._start
    self._presses = 0
    self.turn_count = 0
    self._done = False
    return (
        f"Calculator. The display shows {self._start}. Make it show"
        f" {self._target}. Keys: {', '.join(self._keys)}. Press one key per"
        f" turn, e.g. \\boxed{{{self._keys[0]}}}. You have {self._budget}"
        " presses."
    ), {}

  def step(self, action):
    if self._done:
      return "The game is over.", 0.0, True, False, {}
    self.turn_count += 1
    key = _boxed(action)
    if key not in self._keys:
      msg = f"Press one of {', '.join(self._keys)} inside \\boxed{{}}."
    else:
      self._presses += 1
      self._value = _press(self._value, key)
      if self._value == self._target:
        self._done = True
        return f"Display: {self._value}. Target reached!", 1.0, True, False, {}
      msg = f"Display: {self._value}."
      if self._presses >= self._budget:
        self._done = True
        return f"{msg} No presses left.", 0.0, True, False, {}
    if self.turn_count >= self.max_turns:
      self._done = True
      return f"{msg} Out of turns.", 0.0, False, True, {}
    return (
        f"{msg} Target {self._target}. Keys: {', '.join(self._keys)}."
        f" Presses left: {self._budget - self._presses}.",
        0.0,
        False,
        False,
        {},
    )

  def hint(self):
    return f"The shortest way starts with {self._plan[0]}."

  def solution(self):
    return [f"\\boxed{{{k}}}" for k in self._shortest()]

  def close(self):
    pass
