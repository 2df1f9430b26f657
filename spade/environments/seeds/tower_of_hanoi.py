"""Seed environment (planning): Tower of Hanoi with almost no spare moves."""

import random
import re


def _boxed(action):
  found = re.findall(r"\\boxed\{([^{}]*)\}", action)
  return found[-1].strip().upper() if found else None


def _hanoi(n, src, dst, via, out):
  if n:
    _hanoi(n - 1, src, via, dst, out)
    out.append((src, dst))
    _hanoi(n - 1, via, dst, src, out)


class TowerOfHanoiEnv:
  """Move a stack of discs to another peg, never a larger disc on a smaller.

  Move one top disc per turn, e.g. A C. The move budget is the optimal
  number of moves plus two; an illegal move still costs a move.
  """

  def __init__(self, max_turns=40, **kwargs):
    self.max_turns = max_turns
    self.reset()

  def reset(self, seed=None):
    rng = random.Random(seed)
    self._n = rng.choice([3, 4])
    self._src, self._dst = rng.sample("ABC", 2)
    self._pegs = {p: [] for p in "ABC"}
    self._pegs[self._src] = list(range(self._n, 0, -1))
    self._budget = 2**self._n - 1 + 2
    self._moves = 0
    self.turn_count = 0
    self._done = False
    return (
        f"Tower of Hanoi. Move all {self._n} discs from peg {self._src} to"
        f" peg {self._dst}. Move a top disc with \\boxed{{A C}} (from A to"
        " C). Never put a larger disc on a smaller one. You have"
        f" {self._budget} moves.\n{self._show()}"
    ), {}

  def _show(self):
    return "\n".join(f"{p}: {self._pegs[p]}" for p in "ABC")

  def step(self, action):
    if self._done:
      return "The game is over.", 0.0, True, False, {}
    self.turn_count += 1
    parts = (_boxed(action) or "").split()
    if len(parts) != 2 or not all(p in "ABC" and p for p in parts):
      msg = "Reply like \\boxed{A C}."
    else:
      a, b = parts
      self._moves += 1
      if not self._pegs[a] or (
          self._pegs[b] and self._pegs[b][-1] < self._pegs[a][-1]
      ):
        msg = f"Illegal move {a}->{b}."
      else:
        self._pegs[b].append(self._pegs[a].pop())
        msg = f"Moved disc {self._pegs[b][-1]} from {a} to {b}."
      if len(self._pegs[self._dst]) == self._n:
        self._done = True
        return f"{msg} Tower complete!", 1.0, True, False, {}
      if self._moves >= self._budget:
        self._done = True
        return f"{msg} No moves left.", 0.0, True, False, {}
    if self.turn_count >= self.max_turns:
      self._done = True
      return f"{msg} Out of turns.", 0.0, False, True, {}
    return (
        f"{msg} Moves left: {self._budget - self._moves}.\n{self._show()}",
        0.0,
        False,
        False,
        {},
    )

  def hint(self):
    via = ({"A", "B", "C"} - {self._src, self._dst}).pop()
    return (
        f"Move the top {self._n - 1} discs to {via} first, then the largest"
        f" to {self._dst}."
    )

  def solution(self):
    via = ({"A", "B", "C"} - {self._src, self._dst}).pop()
    moves = []
    _hanoi(self._n, self._src, self._dst, via, moves)
    return [f"\\boxed{{{a} {b}}}" for a, b in moves]

  def close(self):
    pass
