"""Easy environment: find a number from 1 to 15 with higher/lower answers.

Part of the pool sized for a 0.5B model (configs/qwen2p5_coder_0p5b.py
`agent_curve`): four guesses, so halving the range always wins, and guesses
that ignore the answers still win about a quarter of the time.
"""

import random
import re


def _guess(action):
  found = re.findall(r"\\boxed\{\s*(-?\d+)\s*\}", action)
  return int(found[-1]) if found else None


class HigherLowerEnv:
  """Guess the secret number; each wrong guess is answered higher or lower."""

  def __init__(self, max_turns=4, **kwargs):
    self.max_turns = max_turns
    self.reset()

  def reset(self, seed=None):
    rng = random.Random(seed)
    self._secret = rng.randint(1, 15)
    self.turn_count = 0
    self._done = False
    return (
        "I am thinking of a whole number from 1 to 15. Guess it: reply"
        f" \\boxed{{N}}. After each wrong guess I say higher or lower. You"
        f" have {self.max_turns} guesses."
    ), {}

  def step(self, action):
    if self._done:
      return "The game is over.", 0.0, True, False, {}
    self.turn_count += 1
    guess = _guess(action)
    if guess == self._secret:
      self._done = True
      return f"{guess} is right!", 1.0, True, False, {}
    if guess is None:
      msg = "Reply with one whole number inside \\boxed{}, e.g. \\boxed{8}."
    else:
      msg = f"{guess} is wrong; the number is {'higher' if guess < self._secret else 'lower'}."
    left = self.max_turns - self.turn_count
    if left <= 0:
      self._done = True
      return (
          f"{msg} Out of guesses; it was {self._secret}.",
          0.0,
          False,
          True,
          {},
      )
    return f"{msg} Guesses left: {left}.", 0.0, False, False, {}

  def hint(self):
    return f"The number is {'at most 8' if self._secret <= 8 else 'above 8'}."

  def solution(self):
    lo, hi, plan = 1, 15, []
    while True:
      mid = (lo + hi) // 2
      plan.append(f"\\boxed{{{mid}}}")
      if mid == self._secret:
        return plan
      if mid < self._secret:
        lo = mid + 1
      else:
        hi = mid - 1

  def close(self):
    pass
