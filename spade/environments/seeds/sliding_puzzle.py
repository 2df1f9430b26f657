"""Seed environment (spatial): the 8-puzzle, within a few spare moves."""

import collections
import random
import re


def _boxed(action):
  found = re.findall(r"\\boxed\{([^{}]*)\}", action)
  return found[-1].strip().lower() if found else None


_GOAL = (1, 2, 3, 4, 5, 6, 7, 8, 0)
_DIRS = {"up": -3, "down": 3, "left": -1, "right": 1}


def _move(board, d):
  z = board.index(0)
  if (d == "left" and z % 3 == 0) or (d == "right" and z % 3 == 2):
    return None
  t = z + _DIRS[d]
  if not 0 <= t < 9:
    return None
  b = list(board)
  b[z], b[t] = b[t], b[z]
  return tuple(b)


def _solve(board):
  prev = {board: None}
  queue = collections.deque([board])
  while queue:
    b = queue.popleft()
    if b == _GOAL:
      moves = []
      while prev[b] is not None:
        b, d = prev[b]
        moves.append(d)
      return moves[::-1]
    for d in _DIRS:
      n = _move(b, d)
      if n is not None and n not in prev:
        prev[n] = (b, d)
        queue.append(n)
  return None


class SlidingPuzzleEnv:
  """Slide tiles of a 3x3 puzzle back into order 1-8 with the gap last.

  A move slides the gap up, down, left or right (swapping it with a tile).
  The move budget is four more than the fewest moves needed.
  """

  def __init__(self, max_turns=30, **kwargs):
    self.max_turns = max_turns
    self.reset()

  def reset(self, seed=None):
    rng = random.Random(seed)
    while True:
      b = _GOAL
      for _ in range(rng.randint(10, 16)):
        n = _move(b, rng.choice(list(_DIRS)))
        b = n or b
      plan = _solve(b)
      if len(plan) >= 6:
        break
    self._board = b
    self._budget = len(plan) + 4
    self._moves = 0
    self.turn_count = 0
    self._done = False
    return (
        "Sliding puzzle. Order the tiles 1-8 with the gap (_) last. Move the"
        " gap with \\boxed{up}, \\boxed{down}, \\boxed{left} or"
        f" \\boxed{{right}}. You have {self._budget} moves.\n{self._show()}"
    ), {}

  def _show(self):
    cells = [str(x) if x else "_" for x in self._board]
    return "\n".join(" ".join(cells[i : i + 3]) for i in (0, 3, 6))

  def step(self, action):
    if self._done:
      return "The game is over.", 0.0, True, False, {}
    self.turn_count += 1
    d = _boxed(action)
    if d not in _DIRS:
      msg = (
          "Reply with \\boxed{up}, \\boxed{down}, \\boxed{left} or"
          " \\boxed{right}."
      )
    else:
      self._moves += 1
      n = _move(self._board, d)
      msg = f"The gap moved {d}." if n else "The gap cannot move that way."
      self._board = n or self._board
      if self._board == _GOAL:
        self._done = True
        return "Solved!", 1.0, True, False, {}
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
    return f"Fewest moves from here: {len(_solve(self._board))}."

  def solution(self):
    return [f"\\boxed{{{d}}}" for d in _solve(self._board)]

  def close(self):
    pass
