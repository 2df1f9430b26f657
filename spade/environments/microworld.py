"""The curriculum micro-world: type a run of digits, its length the level.

A levelled family (`spade.environments.levels`, registered as
"microworld") of one-turn programs small enough for the tiny byte-level
model to write whole and to learn to play in minutes on a CPU
(docs/curriculum.md, experiments/curriculum.py). The program at level L
pays 1 when the agent's reply starts with L digits and 0 otherwise; L is
the constant `D = L` on the program's first line, so the
designer sets the difficulty by writing one character.

Why a curriculum matters here: a random byte policy types a digit about 4%
of the time, so it wins level 1 a few percent of the time, level 2 about
0.1% and level 6 never. Level L's wins teach the L-th digit only to a policy
that already types L - 1 of them: the agent can climb one level at a time,
and a level far above its frontier gives it no reward to learn from.
Levels far below the frontier pay 1 on every play, which, z-scored per
environment, is no signal either. The informative levels are the frontier
and the one above it.

`hint()` types the first half of the digits for the player (level L then
needs ceil(L / 2): 1, 1, 2, 2, 3, 3), so the hinted play of a level is as
hard as a level about half as high: an agent that types k digits wins the
hinted plays of levels up to 2k and the unhinted ones up to k, and hint
regret is large just above its frontier and zero far below it. At level 1
the hint gives nothing (one digit cannot be halved without typing it). Its
text is empty: the tiny agent cannot read a hint, and any text added to its
prompt changes its replies more than the hint helps (a probe with "One
digit is typed for you." measured hinted returns at or below unhinted ones);
the hint acts through the environment the hinted episode plays.

The variant's name and tag (letters from the seed) appear in the
observation, so that programs of the same level differ and the archive's
duplicate filter keeps them apart.
"""

from __future__ import annotations

import os
import random
import re

from spade.environments import levels

FAMILY = "microworld"
LEVELS = tuple(range(1, 7))  # 1 .. 6 digits
NAMES = ("lock", "safe", "vault")
POOL_DIR = os.path.join(os.path.dirname(__file__), "pools", "microworld")
# Warm start and the uniform pool; the hardest level's pool; held out.
TRAIN_DIR = os.path.join(POOL_DIR, "train")
HARDEST_DIR = os.path.join(POOL_DIR, "hardest")
HELDOUT_DIR = os.path.join(POOL_DIR, "heldout")
# Seeds of the written programs: training ones below, held-out ones at and
# above HELDOUT_SEED, so a held-out program never equals a training one.
TRAIN_SEEDS = (0, 1)
HELDOUT_SEED = 1000

_TEMPLATE = """D = {level}
T = "{name} {tag}"


class DigitLockEnv:
 def reset(s, seed=None):
  s.n = D
  return f"Open the {{T}}: type {{D}} digits.", {{}}

 def hint(s):
  s.n = (D + 1) // 2
  return ""

 def step(s, a):
  w = len(a) >= s.n and a[:s.n].isdigit()
  return "Done.", float(w), True, False, {{}}

 def solution(s):
  return ["7" * D]
"""

_LEVEL_LINE = re.compile(r"^D = (\d+)\s*$", re.MULTILINE)


def tag(seed: int) -> str:
  """Three letters fixed by `seed`: the variant's tag."""
  rng = random.Random(seed)
  return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(3))


def program(name: str, level: int, seed: int) -> str:
  """The source of variant `name` at `level` (1 .. 6 digits), tagged by
  `seed`."""
  if name not in NAMES:
    raise ValueError(f"no microworld variant {name!r}; one of {NAMES}")
  if level not in LEVELS:
    raise ValueError(f"level {level} is not one of {LEVELS}")
  return _TEMPLATE.format(level=level, name=name, tag=tag(seed))


def level_of(source: str) -> int | None:
  """The level a program's text sets (`D = L`), or None if none."""
  m = _LEVEL_LINE.search(source or "")
  return int(m.group(1)) if m else None


class MicroWorld:
  """The family as `spade.environments.levels.Family`."""

  names = NAMES

  def program(self, name: str, level: int, seed: int) -> str:
    return program(name, level, seed)


levels.register(FAMILY, MicroWorld())


def write_pools(root: str = POOL_DIR) -> dict[str, int]:
  """Writes the three folders of programs under `root`; returns counts.

  train/    every variant at every level, seeds `TRAIN_SEEDS`: the
            designer's warm start and the uniform pool
  hardest/  the same at the top level only: the hardest-level pool
  heldout/  one program per variant and level at seeds from HELDOUT_SEED,
            never in a warm start, a pool or (designs are sampled) memory
  """
  counts = {}
  for folder, seeds, lv in (
      ("train", TRAIN_SEEDS, LEVELS),
      ("hardest", TRAIN_SEEDS, LEVELS[-1:]),
      ("heldout", (HELDOUT_SEED,), LEVELS),
  ):
    path = os.path.join(root, folder)
    os.makedirs(path, exist_ok=True)
    n = 0
    for level in lv:
      for v, name in enumerate(NAMES):
        for seed in seeds:
          s = seed + 100 * v + 10 * level
          with open(os.path.join(path, f"{name}_l{level}_s{s}.py"), "w") as f:
            f.write(program(name, level, s))
          n += 1
    counts[folder] = n
  return counts


if __name__ == "__main__":
  print(write_pools())
