"""Seed environment (algebra): three linear equations, three unknowns."""

import random
import re


def _boxed(action):
  found = re.findall(r"\\boxed\{([^{}]*)\}", action)
  return found[-1].replace(" ", "").lower() if found else None


def _det3(m):
  return (
      m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
      - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
      + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0])
  )


class LinearSystemEnv:
  """Three linear equations with integer coefficients have one solution.

  Report the unknowns one per turn (x=3); two wrong values lose the game.
  """

  def __init__(self, max_turns=6, **kwargs):
    self.max_turns = max_turns
    self.reset()

  def reset(self, seed=None):
    rng = random.Random(seed)
    self._sol = {v: rng.randint(-9, 9) for v in "xyz"}
    while True:
      m = [[rng.randint(-5, 5) for _ in range(3)] for _ in range(3)]
      if _det3(m) != 0:
        break
    self._eqs = []
    for row in m:
      rhs = sum(c * self._sol[v] for c, v in zip(row, "xyz"))
      terms = " ".join(
          f"{'+' if c >= 0 else '-'} {abs(c)}{v}" for c, v in zip(row, "xyz")
      )
      self._eqs.append(f"{terms.lstrip('+ ')} = {rhs}")
    self._found = set()
    self._lives = 2
    self.turn_count = 0
    self._done = False
    return (
        f"Linear system.\n{self._show()}\nReport one unknown per turn, e.g."
        " \\boxed{x=4}. Find x, y and z; two wrong values lose."
    ), {}

  def _show(self):
    return "\n".join(self._eqs)

  def step(self, action):
    if self._done:
      return "The game is over.", 0.0, True, False, {}
    self.turn_count += 1
    ans = _boxed(action) or ""
    m = re.fullmatch(r"([xyz])=(-?\d+)", ans)
    if not m:
      msg = "Reply like \\boxed{x=4}."
    elif self._sol[m.group(1)] == int(m.group(2)):
      self._found.add(m.group(1))
      if len(self._found) == 3:
        self._done = True
        return "All unknowns found. Solved!", 1.0, True, False, {}
      msg = f"Correct: {ans}."
    else:
      self._lives -= 1
      msg = f"{ans} is wrong."
      if self._lives == 0:
        self._done = True
        return f"{msg} No lives left.", 0.0, True, False, {}
    if self.turn_count >= self.max_turns:
      self._done = True
      return f"{msg} Out of turns.", 0.0, False, True, {}
    found = ", ".join(f"{v}={self._sol[v]}" for v in sorted(self._found))
    return (
        f"{msg} Known: {found or 'none'}. Lives: {self._lives}.\n"
        + self._show(),
        0.0,
        False,
        False,
        {},
    )

  def hint(self):
    return f"z = {self._sol['z']}."

  def solution(self):
    return [
        f"\\boxed{{{v}={self._sol[v]}}}" for v in "xyz" if v not in self._found
    ]

  def close(self):
    pass
