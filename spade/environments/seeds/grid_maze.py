"""Seed environment (spatial): walk a maze to its exit with few spare moves."""

import collections
import random
import re


def _boxed(action):
  found = re.findall(r"\\boxed\{([^{}]*)\}", action)
  return found[-1].strip().lower() if found else None


_MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}


class GridMazeEnv:
  """Guide a walker through a 7x7 maze from S to the exit E.

  Walls (#) block moves; a blocked move still costs a turn. The move budget
  is only two more than the shortest path.
  """

  def __init__(self, max_turns=30, **kwargs):
    self.max_turns = max_turns
    self.reset()

  def _path(self, start):
    prev = {start: None}
    queue = collections.deque([start])
    while queue:
      cell = queue.popleft()
      if cell == self._exit:
        moves = []
        while prev[cell] is not None:
          cell, move = prev[cell]
          moves.append(move)
        return moves[::-1]
      for name, (dr, dc) in _MOVES.items():
        r, c = cell[0] + dr, cell[1] + dc
        if 0 <= r < 7 and 0 <= c < 7 and self._grid[r][c] != "#":
          if (r, c) not in prev:
            prev[(r, c)] = (cell, name)
            queue.append((r, c))
    return None

  def reset(self, seed=None):
    rng = random.Random(seed)
    while True:
      self._grid = [
          ["#" if rng.random() < 0.3 else "." for _ in range(7)]
          for _ in range(7)
      ]
      self._pos, self._exit = (0, 0), (6, 6)
      corners = [(0, 0), (0, 6), (6, 0), (6, 6)]
      self._pos, self._exit = rng.sample(corners, 2)
      for r, c in (self._pos, self._exit):
        self._grid[r][c] = "."
      path = self._path(self._pos)
      if path and len(path) >= 10:
        break
    self._budget = len(path) + 2
    self._moves = 0
    self.turn_count = 0
    self._done = False
    return (
        "Maze. Move with \\boxed{up}, \\boxed{down}, \\boxed{left} or"
        f" \\boxed{{right}}; reach E in {self._budget} moves.\n{self._show()}"
    ), {}

  def _show(self):
    rows = []
    for r in range(7):
      row = ""
      for c in range(7):
        row += (
            "S"
            if (r, c) == self._pos
            else "E"
            if (r, c) == self._exit
            else self._grid[r][c]
        )
      rows.append(row)
    return "\n".join(rows)

  def step(self, action):
    if self._done:
      return "The game is over.", 0.0, True, False, {}
    self.turn_count += 1
    move = _boxed(action)
    if move not in _MOVES:
      msg = (
          "Reply with \\boxed{up}, \\boxed{down}, \\boxed{left} or"
          " \\boxed{right}."
      )
    else:
      self._moves += 1
      r, c = self._pos[0] + _MOVES[move][0], self._pos[1] + _MOVES[move][1]
      if 0 <= r < 7 and 0 <= c < 7 and self._grid[r][c] != "#":
        self._pos = (r, c)
        msg = f"You moved {move}."
      else:
        msg = "A wall blocks that way."
      if self._pos == self._exit:
        self._done = True
        return "You reached the exit!", 1.0, True, False, {}
      if self._moves >= self._budget:
        self._done = True
        return f"{msg} You are out of moves.", 0.0, True, False, {}
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
    return f"The shortest route begins: {', '.join(self._path(self._pos)[:3])}."

  def solution(self):
    return [f"\\boxed{{{m}}}" for m in self._path(self._pos)]

  def close(self):
    pass
