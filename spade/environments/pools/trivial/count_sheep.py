"""Trivial environment: how many sheep? Any reply starting with a digit wins.

A learning check's pool (tests/learning/test_end_to_end.py); another prompt
for the same skill as digit_first.py, so the pool is not one observation.
"""

import random


class CountSheepEnv:
  """One turn: the reply must start with a digit (any count is accepted)."""

  def __init__(self, max_turns=1, **kwargs):
    self.max_turns = max_turns
    self.reset()

  def reset(self, seed=None):
    self._sheep = random.Random(seed).randint(1, 9)
    self.turn_count = 0
    self._done = False
    return f"Count the sheep: {'sheep ' * self._sheep}".strip(), {}

  def step(self, action):
    if self._done:
      return "The game is over.", 0.0, True, False, {}
    self.turn_count += 1
    self._done = True
    if action[:1].isdigit():
      return "Counted.", 1.0, True, False, {}
    return "Answer with a number first.", 0.0, True, False, {}

  def hint(self):
    return f"There are {self._sheep}; start the reply with that digit."

  def solution(self):
    return [str(self._sheep)]

  def close(self):
    pass
