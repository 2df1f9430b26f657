"""Seed environment (arithmetic): combine numbers step by step to a target."""

import random
import re


def _boxed(action):
  found = re.findall(r"\\boxed\{([^{}]*)\}", action)
  return found[-1].strip() if found else None


def _apply(a, op, b):
  if op == "+":
    return a + b
  if op == "-":
    return a - b if a > b else None
  if op == "*":
    return a * b
  if op == "/":
    return a // b if b and a % b == 0 else None
  return None


class CountdownEnv:
  """Reach a target number by combining a pool of numbers two at a time.

  Each turn pick two numbers from the pool and an operation (+, -, *, /);
  both are replaced by the result. Subtraction must stay positive and
  division exact. Reach the target within five operations.
  """

  def __init__(self, max_turns=5, **kwargs):
    self.max_turns = max_turns
    self.reset()

  def reset(self, seed=None):
    rng = random.Random(seed)
    while True:
      pool = [rng.choice([25, 50, 75, 100])] + [
          rng.randint(1, 10) for _ in range(5)
      ]
      work = list(pool)
      steps = []
      for _ in range(rng.randint(3, 4)):
        a, b = rng.sample(work, 2)
        a, b = max(a, b), min(a, b)
        op = rng.choice("+-*/")
        r = _apply(a, op, b)
        if r is None or r > 999:
          break
        work.remove(a)
        work.remove(b)
        work.append(r)
        steps.append(f"{a} {op} {b}")
      else:
        if r not in pool and r > 10:
          break
    self._start = pool
    self._pool = list(pool)
    self._target = r
    self._steps = steps
    self.turn_count = 0
    self._done = False
    return (
        f"Countdown. Numbers: {self._pool}. Target: {self._target}. Each turn"
        " combine two numbers, e.g. \\boxed{25 + 7}; they are replaced by the"
        f" result. Reach {self._target} within {self.max_turns} operations."
    ), {}

  def step(self, action):
    if self._done:
      return "The game is over.", 0.0, True, False, {}
    self.turn_count += 1
    m = re.fullmatch(r"(\d+)\s*([-+*/])\s*(\d+)", _boxed(action) or "")
    msg = "Reply like \\boxed{25 + 7} with two numbers from the pool."
    if m:
      a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
      rest = list(self._pool)
      if a in rest:
        rest.remove(a)
      ok = a in self._pool and b in rest
      r = _apply(a, op, b) if ok else None
      if r is None:
        msg = f"{a} {op} {b} is not allowed with the pool {self._pool}."
      else:
        rest.remove(b)
        self._pool = rest + [r]
        msg = f"{a} {op} {b} = {r}."
        if r == self._target:
          self._done = True
          return f"{msg} Target reached!", 1.0, True, False, {}
    if self.turn_count >= self.max_turns:
      self._done = True
      return f"{msg} Out of operations.", 0.0, False, True, {}
    return (
        f"{msg} Pool: {self._pool}. Target: {self._target}.",
        0.0,
        False,
        False,
        {},
    )

  def hint(self):
    return f"Start with {self._steps[0]}."

  def solution(self):
    return [f"\\boxed{{{s}}}" for s in self._steps]

  def close(self):
    pass
