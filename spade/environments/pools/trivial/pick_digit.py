"""Trivial environment: two turns to reply with a leading digit.

A learning check's pool (tests/learning/test_end_to_end.py): a miss on the
first turn leaves a second try, so the episode is multi-turn, while a random
byte policy still wins only a few percent.
"""


class PickDigitEnv:
  """Up to two turns; the first reply starting with a digit wins."""

  def __init__(self, max_turns=2, **kwargs):
    self.max_turns = max_turns
    self.reset()

  def reset(self, seed=None):
    self.turn_count = 0
    self._done = False
    return "Pick a digit from 0 to 9.", {}

  def step(self, action):
    if self._done:
      return "The game is over.", 0.0, True, False, {}
    self.turn_count += 1
    if action[:1].isdigit():
      self._done = True
      return "Picked.", 1.0, True, False, {}
    if self.turn_count >= self.max_turns:
      self._done = True
      return "No digit: out of turns.", 0.0, False, True, {}
    return "That is not a digit; try again.", 0.0, False, False, {}

  def hint(self):
    return "Reply with one digit, like 3."

  def solution(self):
    return ["3"]

  def close(self):
    pass
