"""Seed environment (optimisation): pay an amount with the fewest coins."""

import random
import re


def _boxed(action):
  found = re.findall(r"\\boxed\{([^{}]*)\}", action)
  return found[-1].strip().lower() if found else None


class CoinChangeEnv:
  """Pay an exact amount one coin per turn, using as few coins as possible.

  The coin values make the greedy choice (always the largest coin) wrong
  in general. Overpaying loses, and so does using more coins than needed.
  """

  def __init__(self, max_turns=12, **kwargs):
    self.max_turns = max_turns
    self.reset()

  def _fewest(self, amount):
    best = [0] + [None] * amount
    for a in range(1, amount + 1):
      opts = [
          best[a - c] for c in self._coins if c <= a and best[a - c] is not None
      ]
      best[a] = min(opts) + 1 if opts else None
    return best

  def reset(self, seed=None):
    rng = random.Random(seed)
    while True:
      self._coins = sorted(
          {1, rng.randint(3, 6), rng.randint(7, 12), rng.randint(13, 25)}
      )
      self._amount = rng.randint(30, 70)
      best = self._fewest(self._amount)
      # Keep only puzzles where greedy is worse than the optimum.
      greedy, left = 0, self._amount
      for c in reversed(self._coins):
        greedy += left // c
        left %= c
      if len(self._coins) == 4 and greedy > best[self._amount]:
        break
    self._need = best[self._amount]
    self._paid = 0
    self._used = 0
    self.turn_count = 0
    self._done = False
    return (
        f"Coins. Pay exactly {self._amount} using coins of value"
        f" {self._coins}, as few coins as possible. Pay one coin per turn:"
        f" \\boxed{{{self._coins[-1]}}}. Overpaying or using extra coins"
        " loses."
    ), {}

  def step(self, action):
    if self._done:
      return "The game is over.", 0.0, True, False, {}
    self.turn_count += 1
    ans = _boxed(action)
    if not (ans and ans.isdigit() and int(ans) in self._coins):
      msg = f"Pay one coin from {self._coins} inside \\boxed{{}}."
    else:
      self._paid += int(ans)
      self._used += 1
      if self._paid > self._amount:
        self._done = True
        return f"Overpaid: {self._paid}.", 0.0, True, False, {}
      if self._paid == self._amount:
        self._done = True
        if self._used == self._need:
          return f"Paid with {self._used} coins: optimal!", 1.0, True, False, {}
        return (
            f"Paid with {self._used} coins; {self._need} was enough.",
            0.0,
            True,
            False,
            {},
        )
      if self._used >= self._need:
        self._done = True
        return "Too many coins used.", 0.0, True, False, {}
      msg = f"Paid {self._paid} of {self._amount} with {self._used} coins."
    if self.turn_count >= self.max_turns:
      self._done = True
      return f"{msg} Out of turns.", 0.0, False, True, {}
    return msg, 0.0, False, False, {}

  def hint(self):
    return f"It can be done with {self._need} coins; greedy is not optimal."

  def solution(self):
    left = self._amount - self._paid
    best = self._fewest(left)
    plan = []
    while left:
      c = next(
          c
          for c in self._coins
          if c <= left
          and best[left - c] is not None
          and best[left - c] == best[left] - 1
      )
      plan.append(f"\\boxed{{{c}}}")
      left -= c
    return plan

  def close(self):
    pass
