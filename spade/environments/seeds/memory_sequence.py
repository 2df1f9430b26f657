"""Seed environment (memory): recall items shown one at a time."""

import random
import re


def _boxed(action):
  found = re.findall(r"\\boxed\{([^{}]*)\}", action)
  return found[-1].strip().lower() if found else None


_WORDS = [
    "anchor",
    "barrel",
    "candle",
    "dagger",
    "easel",
    "falcon",
    "goblet",
    "hammer",
    "igloo",
    "jigsaw",
    "kettle",
    "lantern",
    "magnet",
    "needle",
    "oyster",
    "parrot",
    "quiver",
    "ribbon",
    "saddle",
    "trumpet",
    "urchin",
    "violin",
    "walrus",
    "yacht",
    "zipper",
]


class MemorySequenceEnv:
  """Items are shown one per turn and never again; then questions follow.

  Acknowledge each item with \\boxed{next}. Then answer three questions of
  the form 'which item was shown at position k'; one wrong answer loses.
  """

  def __init__(self, max_turns=12, **kwargs):
    self.max_turns = max_turns
    self.reset()

  def reset(self, seed=None):
    rng = random.Random(seed)
    self._items = rng.sample(_WORDS, 7)
    self._questions = rng.sample(range(7), 3)
    self._shown = 1
    self._asked = 0
    self.turn_count = 0
    self._done = False
    return (
        "Memory. You will see 7 items, one per turn, each only once. Reply"
        " \\boxed{next} to see the next one. Then you will be asked which item"
        " was at a given position; answer like \\boxed{kettle}. One wrong"
        f" answer loses.\nItem 1: {self._items[0]}"
    ), {}

  def _question(self):
    return (
        f"Which item was shown at position {self._questions[self._asked] + 1}?"
    )

  def step(self, action):
    if self._done:
      return "The game is over.", 0.0, True, False, {}
    self.turn_count += 1
    ans = _boxed(action)
    if self._shown < 7:
      if ans == "next":
        self._shown += 1
        obs = f"Item {self._shown}: {self._items[self._shown - 1]}"
        if self._shown == 7:
          obs += "\nThat was the last item. Reply \\boxed{next} for questions."
      else:
        obs = "Reply \\boxed{next} to see the next item."
    elif self._shown == 7:
      self._shown = 8
      obs = self._question()
    elif ans == self._items[self._questions[self._asked]]:
      self._asked += 1
      if self._asked == 3:
        self._done = True
        return "Correct! Perfect recall.", 1.0, True, False, {}
      obs = f"Correct. {self._question()}"
    else:
      self._done = True
      return "Wrong answer. Game over.", 0.0, True, False, {}
    if self.turn_count >= self.max_turns:
      self._done = True
      return f"{obs}\nOut of turns.", 0.0, False, True, {}
    return obs, 0.0, False, False, {}

  def hint(self):
    return f"The first question asks about item {self._questions[0] + 1}."

  def solution(self):
    plan = ["\\boxed{next}"] * (8 - self._shown)
    return plan + [
        f"\\boxed{{{self._items[q]}}}" for q in self._questions[self._asked :]
    ]

  def close(self):
    pass
