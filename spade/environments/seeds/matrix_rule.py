"""Seed environment (pattern): fill the missing cell of number grids."""

import random
import re


def _boxed(action):
  found = re.findall(r"\\boxed\{([^{}]*)\}", action)
  return found[-1].strip() if found else None


_OPS = {
    "sum": lambda x, y: x + y,
    "difference": lambda x, y: x - y,
    "product": lambda x, y: x * y,
    "sum doubled": lambda x, y: 2 * (x + y),
    "x*2 + y": lambda x, y: 2 * x + y,
}


class MatrixRuleEnv:
  """Three 3x3 number grids, each with its bottom-right cell missing.

  In every grid each row's third number follows the same hidden rule from
  the first two. Find the missing number of each grid in turn; two wrong
  answers lose the game.
  """

  def __init__(self, max_turns=6, **kwargs):
    self.max_turns = max_turns
    self.reset()

  def reset(self, seed=None):
    rng = random.Random(seed)
    self._grids = []
    for _ in range(3):
      op = rng.choice(sorted(_OPS))
      rows = []
      for _ in range(3):
        x, y = rng.randint(2, 15), rng.randint(1, 12)
        rows.append((x, y, _OPS[op](x, y)))
      self._grids.append((op, rows))
    self._round = 0
    self._lives = 2
    self.turn_count = 0
    self._done = False
    return (
        "Matrix rule. In each grid the third number of every row comes from"
        " the first two by one hidden rule. Give the missing number as"
        f" \\boxed{{N}}. Two mistakes lose.\n{self._show()}"
    ), {}

  def _show(self):
    _, rows = self._grids[self._round]
    lines = [f"{a:4d} {b:4d} {c:4d}" for a, b, c in rows[:2]]
    a, b, _ = rows[2]
    lines.append(f"{a:4d} {b:4d}    ?")
    return f"Grid {self._round + 1}/3:\n" + "\n".join(lines)

  def step(self, action):
    if self._done:
      return "The game is over.", 0.0, True, False, {}
    self.turn_count += 1
    ans = _boxed(action)
    target = self._grids[self._round][1][2][2]
    if ans is not None and ans.lstrip("-").isdigit() and int(ans) == target:
      self._round += 1
      if self._round == 3:
        self._done = True
        return "Correct! All three grids solved.", 1.0, True, False, {}
      msg = "Correct."
    else:
      self._lives -= 1
      msg = "Wrong (answer with \\boxed{N})."
      if self._lives == 0:
        self._done = True
        return f"{msg} The answer was {target}. You lose.", 0.0, True, False, {}
    if self.turn_count >= self.max_turns:
      self._done = True
      return f"{msg} Out of turns.", 0.0, False, True, {}
    return f"{msg} Lives: {self._lives}.\n{self._show()}", 0.0, False, False, {}

  def hint(self):
    return f"The rule of this grid is: third = {self._grids[self._round][0]}."

  def solution(self):
    return [
        f"\\boxed{{{rows[2][2]}}}" for _, rows in self._grids[self._round :]
    ]

  def close(self):
    pass
