"""Seed environment (memory): the card game Concentration."""

import random
import re


def _boxed(action):
  found = re.findall(r"\\boxed\{([^{}]*)\}", action)
  return found[-1].strip().lower() if found else None


_SYMBOLS = ["sun", "moon", "star", "tree", "fish", "bird", "key", "ring"]


class PairsConcentrationEnv:
  """Ten face-down cards hide five pairs. Flip two cards per turn.

  A matching pair is removed; otherwise both turn face down again and are
  not shown again, so remember them. Clear the table within nine turns.
  """

  def __init__(self, max_turns=9, **kwargs):
    self.max_turns = max_turns
    self.reset()

  def reset(self, seed=None):
    rng = random.Random(seed)
    symbols = rng.sample(_SYMBOLS, 5) * 2
    rng.shuffle(symbols)
    self._cards = symbols
    self._gone = set()
    self.turn_count = 0
    self._done = False
    return (
        "Concentration. Cards 1-10 lie face down; they hide five pairs."
        " Flip two per turn with \\boxed{flip 3 7}. A pair is removed; other"
        f" cards are turned back (remember them!). Clear the table in"
        f" {self.max_turns} turns.\n{self._show()}"
    ), {}

  def _show(self):
    return "Table: " + " ".join(
        "--" if i in self._gone else str(i + 1) for i in range(10)
    )

  def step(self, action):
    if self._done:
      return "The game is over.", 0.0, True, False, {}
    self.turn_count += 1
    cmd = (_boxed(action) or "").split()
    ok = (
        len(cmd) == 3
        and cmd[0] == "flip"
        and cmd[1].isdigit()
        and cmd[2].isdigit()
    )
    i, j = (int(cmd[1]) - 1, int(cmd[2]) - 1) if ok else (-1, -1)
    if (
        not ok
        or i == j
        or not (0 <= i < 10 and 0 <= j < 10)
        or ({i, j} & self._gone)
    ):
      msg = "Flip two different cards still on the table: \\boxed{flip A B}."
    else:
      a, b = self._cards[i], self._cards[j]
      if a == b:
        self._gone |= {i, j}
        msg = f"Card {i + 1}: {a}, card {j + 1}: {b}. A pair!"
        if len(self._gone) == 10:
          self._done = True
          return f"{msg} Table cleared!", 1.0, True, False, {}
      else:
        msg = f"Card {i + 1}: {a}, card {j + 1}: {b}. No match."
    if self.turn_count >= self.max_turns:
      self._done = True
      return f"{msg} Out of turns.", 0.0, False, True, {}
    return (
        f"{msg}\n{self._show()} Turns left:"
        f" {self.max_turns - self.turn_count}.",
        0.0,
        False,
        False,
        {},
    )

  def hint(self):
    first = self._cards[0]
    other = [k for k in range(1, 10) if self._cards[k] == first][0]
    return f"Card 1 and card {other + 1} match."

  def solution(self):
    plan, seen = [], set()
    for i in range(10):
      if i in self._gone or i in seen:
        continue
      j = [k for k in range(10) if k != i and self._cards[k] == self._cards[i]][
          0
      ]
      seen |= {i, j}
      plan.append(f"\\boxed{{flip {i + 1} {j + 1}}}")
    return plan

  def close(self):
    pass
