"""Easy environment: add two numbers, with a second try.

Part of the pool sized for a 0.5B model (configs/qwen2p5_coder_0p5b.py
`agent_curve`): a two- and a three-digit number, the sum in \\boxed{}; a
wrong first answer is told so and may be corrected once.
"""

import random
import re


def _answer(action):
  found = re.findall(r"\\boxed\{\s*(-?[\d,]+)\s*\}", action)
  return int(found[-1].replace(",", "")) if found else None


class AddNumbersEnv:
  """Reply with the sum of the two numbers; two tries."""

  def __init__(self, max_turns=2, **kwargs):
    self.max_turns = max_turns
    self.reset()

  def reset(self, seed=None):
    rng = random.Random(seed)
    self._a, self._b = rng.randint(10, 99), rng.randint(100, 999)
    self.turn_count = 0
    self._done = False
    return (
        f"What is {self._a} + {self._b}? Reply with the sum as \\boxed{{N}}."
        f" You have {self.max_turns} tries."
    ), {}

  def step(self, action):
    if self._done:
      return "The game is over.", 0.0, True, False, {}
    self.turn_count += 1
    answer = _answer(action)
    if answer == self._a + self._b:
      self._done = True
      return "Correct!", 1.0, True, False, {}
    msg = (
        "Put the sum inside \\boxed{}."
        if answer is None
        else f"{answer} is not {self._a} + {self._b}."
    )
    if self.turn_count >= self.max_turns:
      self._done = True
      return f"{msg} Out of tries.", 0.0, False, True, {}
    return f"{msg} Try again.", 0.0, False, False, {}

  def hint(self):
    return f"{self._b} + {self._a // 10 * 10} = {self._b + self._a // 10 * 10}."

  def solution(self):
    return [f"\\boxed{{{self._a + self._b}}}"]

  def close(self):
    pass
