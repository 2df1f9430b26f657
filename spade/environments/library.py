"""The seed library: hand-written environments with hints and solutions.

Seeds are environment programs under ``seeds/`` in the contract's format, one
file each. They serve warm starts (`solution_episode` gives supervised
trajectories), tests, the fixed-pool baseline and, for the ones marked held
out, the ``seed_heldout`` eval suite; train-time code uses `train_programs`.
Seeds are trusted code, so `solution_episode` runs them in this process.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from spade.environments import contract
from spade.environments import runtime

SEEDS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seeds")

# name -> (category, held out). Held-out seeds are spread over categories and
# never used for training.
CATALOGUE = {
    "mastermind": ("pattern", False),
    "sequence_next": ("pattern", False),
    "matrix_rule": ("pattern", True),
    "knights_knaves": ("deduction", False),
    "logic_grid": ("deduction", False),
    "twenty_questions": ("deduction", True),
    "calculator_target": ("arithmetic", False),
    "linear_system": ("arithmetic", False),
    "countdown": ("arithmetic", False),
    "grid_maze": ("spatial", False),
    "sliding_puzzle": ("spatial", False),
    "box_push": ("spatial", True),
    "tower_of_hanoi": ("planning", False),
    "water_jugs": ("planning", False),
    "crafting": ("planning", False),
    "switch_lights": ("causal", False),
    "faulty_component": ("causal", False),
    "plant_growth": ("causal", True),
    "memory_sequence": ("memory", False),
    "pairs_concentration": ("memory", False),
    "shopping_list": ("memory", False),
    "knapsack": ("optimisation", False),
    "job_scheduling": ("optimisation", False),
    "coin_change": ("optimisation", False),
    "word_ladder": ("language", False),
    "anagram_rounds": ("language", False),
    "hangman": ("language", True),
    "order_lookup": ("tool_use", False),
    "calendar_booking": ("tool_use", False),
    "bank_transfer": ("tool_use", False),
    "table_query": ("tool_use", False),
    "file_search": ("tool_use", True),
}


class SeedProgram(NamedTuple):
  """One seed environment.

  Attributes:
    name: the file's stem, e.g. "mastermind".
    category: one of `contract.CATEGORIES`.
    source: the program's Python source.
    heldout: True for the seeds reserved for the `seed_heldout` eval suite.
  """

  name: str
  category: str
  source: str
  heldout: bool


def seed_programs() -> list[SeedProgram]:
  """Returns every seed program, in catalogue order.

  Raises:
    FileNotFoundError: when a catalogued seed file is missing, or a file in
      seeds/ is not catalogued (so none is silently dropped).
  """
  on_disk = {f[:-3] for f in os.listdir(SEEDS_DIR) if f.endswith(".py")}
  missing = sorted(set(CATALOGUE) - on_disk)
  extra = sorted(on_disk - set(CATALOGUE))
  if missing or extra:
    raise FileNotFoundError(
        f"seed files and CATALOGUE disagree in {SEEDS_DIR}: missing files"
        f" {missing}, uncatalogued files {extra}; add or catalogue them in"
        " spade/environments/library.py"
    )
  programs = []
  for name, (category, heldout) in CATALOGUE.items():
    with open(os.path.join(SEEDS_DIR, name + ".py"), encoding="utf-8") as f:
      programs.append(SeedProgram(name, category, f.read(), heldout))
  return programs


def train_programs() -> list[SeedProgram]:
  """Returns the seeds training may use (the held-out ones excluded)."""
  return [p for p in seed_programs() if not p.heldout]


def heldout_programs() -> list[SeedProgram]:
  """Returns the seeds reserved for the `seed_heldout` eval suite."""
  return [p for p in seed_programs() if p.heldout]


def get_program(name: str) -> SeedProgram:
  """Returns one seed by name; a KeyError lists the known names."""
  for p in seed_programs():
    if p.name == name:
      return p
  raise KeyError(f"no seed named {name!r}; known: {sorted(CATALOGUE)}")


def solution_episode(source: str, seed: int) -> list[tuple[str, str]]:
  """Plays a trusted program's solution() and returns the winning trajectory.

  Runs in this process: use it only on trusted code (the seed library).

  Args:
    source: the program's source.
    seed: the episode's seed.

  Returns:
    [(observation, action), ...]: the observation the agent saw before each
    action of the solution, ending with the winning action.

  Raises:
    ValueError: the program has no list solution(), or it does not win.
  """
  cls = runtime.load_program(source, "<seed>")
  env = runtime.instantiate(cls)
  obs, _ = env.reset(seed=seed)
  plan = env.solution() if callable(getattr(env, "solution", None)) else None
  if not isinstance(plan, (list, tuple)):
    raise ValueError(
        f"{cls.__name__}.solution() must return a list of actions to give a"
        f" trajectory, got {type(plan).__name__}"
    )
  trajectory = []
  for action in plan:
    trajectory.append((obs, action))
    obs, reward, terminated, truncated, _ = env.step(action)
    if terminated:
      if reward == contract.WIN_REWARD:
        return trajectory
      break
    if truncated:
      break
  raise ValueError(
      f"{cls.__name__}.solution() did not win the episode of seed {seed}"
  )
