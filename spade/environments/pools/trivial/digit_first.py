"""Trivial environment: any reply that starts with a digit wins.

A learning check's pool (tests/learning/test_end_to_end.py): one turn, a
reward a random byte policy earns a few percent of the time (10 of 259
tokens), so the curve starts near 0 and has room to rise.
"""


class DigitFirstEnv:
  """One turn: reward 1 if the reply's first character is a digit."""

  def __init__(self, max_turns=1, **kwargs):
    self.max_turns = max_turns
    self.reset()

  def reset(self, seed=None):
    self.turn_count = 0
    self._done = False
    return "Reply with a number.", {}

  def step(self, action):
    if self._done:
      return "The game is over.", 0.0, True, False, {}
    self.turn_count += 1
    self._done = True
    if action[:1].isdigit():
      return "A number: you win.", 1.0, True, False, {}
    return "That does not start with a digit.", 0.0, True, False, {}

  def hint(self):
    return "Start the reply with a digit, like 7."

  def solution(self):
    return ["7"]

  def close(self):
    pass
