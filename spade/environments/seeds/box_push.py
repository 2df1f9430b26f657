"""Seed environment (spatial): push one box onto its target (Sokoban)."""

import collections
import random
import re


def _boxed(action):
  found = re.findall(r"\\boxed\{([^{}]*)\}", action)
  return found[-1].strip().lower() if found else None


_MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
_N = 6


class BoxPushEnv:
  """A warehouse keeper (@) pushes a box ($) onto the target (x).

  The keeper walks one square per move and pushes the box by walking into
  it; boxes cannot be pulled. The move budget is four more than the fewest
  moves needed.
  """

  def __init__(self, max_turns=30, **kwargs):
    self.max_turns = max_turns
    self.reset()

  def _free(self, r, c):
    return 0 <= r < _N and 0 <= c < _N and (r, c) not in self._walls

  def _solve(self, me, box):
    start = (me, box)
    prev = {start: None}
    queue = collections.deque([start])
    while queue:
      state = queue.popleft()
      if state[1] == self._target:
        moves = []
        while prev[state] is not None:
          state, m = prev[state]
          moves.append(m)
        return moves[::-1]
      (r, c), b = state
      for m, (dr, dc) in _MOVES.items():
        n = (r + dr, c + dc)
        if not self._free(*n):
          continue
        nb = b
        if n == b:
          nb = (b[0] + dr, b[1] + dc)
          if not self._free(*nb):
            continue
        if (n, nb) not in prev:
          prev[(n, nb)] = (state, m)
          queue.append((n, nb))
    return None

  def reset(self, seed=None):
    rng = random.Random(seed)
    cells = [(r, c) for r in range(_N) for c in range(_N)]
    while True:
      self._walls = set(rng.sample(cells, 6))
      free = [x for x in cells if x not in self._walls]
      me, box, self._target = rng.sample(free, 3)
      if box[0] in (0, _N - 1) or box[1] in (0, _N - 1):
        continue
      plan = self._solve(me, box)
      if plan and len(plan) >= 6:
        break
    self._me, self._box = me, box
    self._budget = len(plan) + 4
    self._moves = 0
    self.turn_count = 0
    self._done = False
    return (
        "Box push. Walk the keeper @ with \\boxed{up}, \\boxed{down},"
        " \\boxed{left} or \\boxed{right}; walking into the box $ pushes it."
        f" Get the box onto x within {self._budget} moves. # is a wall and"
        f" the grid edge is a wall too.\n{self._show()}"
    ), {}

  def _show(self):
    rows = []
    for r in range(_N):
      row = ""
      for c in range(_N):
        p = (r, c)
        row += (
            "@"
            if p == self._me
            else "$"
            if p == self._box
            else "x"
            if p == self._target
            else "#"
            if p in self._walls
            else "."
        )
      rows.append(row)
    return "\n".join(rows)

  def step(self, action):
    if self._done:
      return "The game is over.", 0.0, True, False, {}
    self.turn_count += 1
    m = _boxed(action)
    if m not in _MOVES:
      msg = (
          "Reply with \\boxed{up}, \\boxed{down}, \\boxed{left} or"
          " \\boxed{right}."
      )
    else:
      self._moves += 1
      dr, dc = _MOVES[m]
      n = (self._me[0] + dr, self._me[1] + dc)
      msg = "Blocked."
      if self._free(*n):
        if n == self._box:
          nb = (n[0] + dr, n[1] + dc)
          if self._free(*nb):
            self._me, self._box = n, nb
            msg = f"You pushed the box {m}."
        else:
          self._me = n
          msg = f"You walked {m}."
      if self._box == self._target:
        self._done = True
        return "The box is on the target!", 1.0, True, False, {}
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
    plan = self._solve(self._me, self._box) or []
    return f"A shortest plan starts: {', '.join(plan[:3])}."

  def solution(self):
    return [f"\\boxed{{{m}}}" for m in self._solve(self._me, self._box)]

  def close(self):
    pass
