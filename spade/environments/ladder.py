"""The skill ladder: say the first L letters of a fixed secret code.

A levelled family (`spade.environments.levels`, registered as "ladder") of
one-turn programs, built so that only the frontier teaches
(docs/curriculum.md, experiments/curriculum.py). The program at level L
pays 1 when the agent's reply starts with the first L characters of
`SECRET`, a fixed string over the 4 letters of `ALPHABET`, and 0 otherwise.
L is the literal on the program's first line (`L = 7`), so the designer
sets the difficulty by writing a number.

Why only the frontier teaches: an agent that says the first k letters
right wins every level up to k (all wins: no signal once z-scored) and
wins level k + 1 only when it guesses letter k + 1 (1 time in 4 at first):
the groups with mixed outcomes, the ones that carry signal, are at the
frontier and the one or two rungs above it. Letter L + 1 is learned only
from wins at level L + 1 or above, since no lower level's reward depends
on it; a level far above the frontier never pays (4^-(L - k) at random).
Nothing transfers between rungs: each is one new letter.

`hint()` lowers the requirement by exactly one letter (level L then needs
L - 1; level 1 needs none). An agent at frontier k wins the hinted plays up
to level k + 1 and the unhinted ones up to level k, so hint regret is
largest at level k + 1, exactly where it learns, and 0 at every other
level far from it. The hint acts on the environment: its text is empty
(the tiny agent cannot read one).

There is one variant and no tag: every program of a level is the same
text, so the pool is 16 programs, one a level.
"""

from __future__ import annotations

import os
import re

from spade.environments import levels

FAMILY = "ladder"
LEVELS = tuple(range(1, 17))  # 1 .. 16 letters
ALPHABET = "abcd"
# Fixed once: every program writes it. Each letter 4 times and never twice
# in a row, so no rung is "the last letter again".
SECRET = "dacbdcabdbcadcab"
NAMES = ("ladder",)
POOL_DIR = os.path.join(os.path.dirname(__file__), "pools", "ladder")
# Every level once: the designer's warm start and the uniform pool.
TRAIN_DIR = os.path.join(POOL_DIR, "train")

_TEMPLATE = """L = {level}
S = "{secret}"


class LadderEnv:
 def reset(s, seed=None):
  s.n = L
  return f"Say {{L}} letters.", {{}}

 def hint(s):
  s.n = L - 1
  return ""

 def step(s, a):
  return "", float(a[:s.n] == S[:s.n]), True, False, {{}}
"""

_LEVEL_LINE = re.compile(r"^L = (\d+)\s*$", re.MULTILINE)
_SECRET_LINE = re.compile(r'^S = "([^"\n]*)"\s*$', re.MULTILINE)


def program(level: int, secret: str = SECRET) -> str:
  """The source of the program at `level` (1 .. 16 letters)."""
  if level not in LEVELS:
    raise ValueError(f"level {level} is not one of {LEVELS}")
  return _TEMPLATE.format(level=level, secret=secret)


def observation(level: int) -> str:
  """What the program at `level` says at reset (the agent's prompt)."""
  return f"Say {level} letters."


def level_of(source: str) -> int | None:
  """The level a program's text sets (`L = 7`), or None if none."""
  m = _LEVEL_LINE.search(source or "")
  return int(m.group(1)) if m else None


def keeps_secret(source: str) -> bool:
  """Whether a program still writes the family's secret (a design that
  changed it is valid, but teaches a different ladder)."""
  m = _SECRET_LINE.search(source or "")
  return bool(m) and m.group(1) == SECRET


def wins(reply: str, level: int, hinted: bool = False) -> bool:
  """The program's reward rule, in the host: the reply starts with the
  first `level` letters (one fewer with the hint)."""
  n = level - 1 if hinted else level
  return reply[:n] == SECRET[:n]


class Ladder:
  """The family as `spade.environments.levels.Family`."""

  names = NAMES

  def program(self, name: str, level: int, seed: int) -> str:
    """The program at `level`; `seed` is unused (one program a level)."""
    del seed
    if name not in NAMES:
      raise ValueError(f"no ladder variant {name!r}; one of {NAMES}")
    return program(level)


levels.register(FAMILY, Ladder())


def write_pools(root: str = POOL_DIR) -> dict[str, int]:
  """Writes `train/` under `root` (one program a level); returns counts."""
  path = os.path.join(root, "train")
  os.makedirs(path, exist_ok=True)
  for level in LEVELS:
    with open(os.path.join(path, f"ladder_l{level:02d}.py"), "w") as f:
      f.write(program(level))
  return {"train": len(LEVELS)}


if __name__ == "__main__":
  print(write_pools())
