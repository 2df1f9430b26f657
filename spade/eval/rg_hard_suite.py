r"""The paper's reasoning-gym columns: the 100 A.3 "hard" tasks in 4 buckets.

  python -m spade.eval --config=configs/qwen2p5_coder_0p5b.py:runlocal \
      --workdir=runs/qwen05b --suite=rg_hard --num_examples=8

What the reference (`spade-rl/spade` at 9b2b813) scores for RG:Math,
RG:Algorithmic, RG:Cognition and RG:Logic, rule by rule:

- Tasks: `HARD_CONFIGS`, the "# hard" column of appendix A.3 of the
  reasoning-gym paper (arXiv 2505.24760), copied from
  `spade/core/eval/rg_a3_hard.py`. All 100 build unchanged with
  reasoning-gym 0.1.25 (`tests/eval/test_rg_hard.py` builds them).
- Items: the reference makes each task's dataset with `size=500, seed=42`
  and draws every episode with an unseeded `random.choice`
  (`spade/core/envs/gem_adapter.py`, `SpadeReasoningGymEnv.reset`); here
  example i of a task is entry i of that same dataset, so a run is
  repeatable. `--num_examples` is the number of examples PER TASK (the
  reference plays 8, `eval_offline/configs/_games_gem.yaml`); the summary's
  `num_examples` counts them over all 100 tasks.
- Generation (ours where the reference has no rule; `generate`): an entry
  whose generator fails is drawn again from entry i + 500k, k = 1..4, and
  listed under `redrawn` (knight_swap fails on entries 18, 23, 41, 52, 62
  and 78 of its first 100 in reasoning-gym 0.1.25, pinned in `setup.py`);
  the reference's episode on such an entry raises and counts as an error.
  codeio runs each entry's code sample, and numpy 2.4 refuses the
  `np.sum(generator)` of entry 49, so codeio generates under a shim that
  sums a generator as numpy < 2.4 did (the reference pins no numpy). A task
  reasoning-gym cannot build, or an example none of whose draws generates,
  is listed under `errors` by id ("knight_swap/18"), with why, and the
  rest of the suite is scored.
- Prompt: one user turn, `_build_initial_prompt` of
  `spade/core/eval/gem_evaluator.py` for the `rg` category around the
  environment's observation, which is the question plus the env's own
  "Put your final answer within \boxed{}." line (both kept as written).
  A prompt longer than the responder's prompt budget is a loss and is not
  posed, as the reference ends an episode whose prompt leaves under 256
  tokens of its context; cutting it would cut the task and the answer
  format, and a 50x50 grid does not fit a small context.
- Answer: the last `<answer>...</answer>` (any case, stripped), else the
  content of the last `\boxed{...}` by GEM's `extract_last_boxed_answer`,
  else None; scored by the task's `score_answer` (`SpadeReasoningGymEnv.step`).
- Win: reward >= 1 (`gem_evaluator.py`: `reward >= 1.0 - 1e-9`); partial
  credit is a loss. An item's score is 1.0 for a win, else 0.0.
- Buckets: `BUCKETS`, the Golden Goose roll-up `RG_GOLDEN_GOOSE` of
  `spade/core/eval/gem_tasks.py` (31 Math, 36 Algorithmic, 24 Cognition,
  9 Logic). A bucket's win rate pools its episodes, wins / episodes
  (`GemEvaluator.evaluate_all`), as does the overall `score`; a verifier that
  raises makes its episode an error, left out of both and listed under
  `errors` in the summary.

Sampling (temperature, top-k/p, reply length, prompt budget) is the
config's, as for every suite; the reference samples at temperature 0.6,
top-p 0.8, top-k 20 with up to 8,192 new tokens in a 32,768-token context.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import functools
import importlib.metadata
import io
import re
import types
from typing import Any, Iterator, Sequence

from spade.eval import registry

# The "# hard" column of A.3 (`spade/core/eval/rg_a3_hard.py`), verbatim.
HARD_CONFIGS: dict[str, dict[str, Any]] = {
    "ab": {"length": 25},
    "acre": {},
    "advanced_geometry": {"max_coord": 100, "min_coord": -100},
    "aiw": {"max_entities": 10, "task_type_weights": [0.5, 0.25, 0.25]},
    "arc_1d": {"max_size": 50, "min_size": 25},
    "arc_agi": {
        "mirrors_weights": [0.2, 0.2, 0.2, 0.2, 0.2],
        "rotations_weights": [0.15, 0.3, 0.25, 0.3],
    },
    "base_conversion": {
        "max_base": 18,
        "max_value": 100000,
        "min_base": 9,
        "min_value": 10000,
    },
    "basic_arithmetic": {
        "max_digits": 5,
        "max_terms": 10,
        "min_digits": 2,
        "min_terms": 5,
    },
    "bf": {"difficulty": 2},
    "binary_alternation": {"max_n": 500, "min_n": 50},
    "binary_matrix": {"max_n": 50, "min_n": 25, "p_zero": 0.25},
    "bitwise_arithmetic": {"difficulty": 5},
    "caesar_cipher": {
        "max_rotation": 25,
        "max_words": 25,
        "min_rotation": 15,
        "min_words": 15,
    },
    "calendar_arithmetic": {
        "offset_upper_bound": 200,
        "tasks": [
            "weekday_of_date",
            "is_leap_year",
            "weekday_offset",
            "count_days",
            "count_business_days",
        ],
    },
    "chain_sum": {
        "max_digits": 6,
        "max_terms": 8,
        "min_digits": 4,
        "min_terms": 5,
    },
    "circuit_logic": {
        "max_inputs": 8,
        "max_terms": 20,
        "min_inputs": 4,
        "min_terms": 10,
    },
    "codeio": {"difficulty": 7},
    "color_cube_rotation": {"max_rotations": 50, "min_rotations": 10},
    "complex_arithmetic": {
        "max_imag": 100,
        "max_real": 100,
        "min_imag": -100,
        "min_real": -100,
        "operations_weights": [0.25, 0.25, 0.25, 0.25],
    },
    "count_bits": {"max_n": 100000000, "min_n": 1000000},
    "count_primes": {"max_n": 50000, "min_n": 10000},
    "countdown": {
        "max_numbers": 9,
        "max_target": 1000,
        "max_value": 100,
        "min_numbers": 3,
        "min_target": 100,
        "min_value": 1,
    },
    "course_schedule": {
        "max_cycle_length": 4,
        "max_num_courses": 50,
        "max_num_prerequisites": 4,
        "min_cycle_length": 3,
        "min_num_courses": 25,
        "min_num_prerequisites": 3,
    },
    "cryptarithm": {"max_words": 10, "min_words": 5},
    "decimal_arithmetic": {
        "max_num_decimal_places": 8,
        "max_terms": 8,
        "min_num_decimal_places": 5,
        "min_terms": 5,
        "precision": 10,
    },
    "decimal_chain_sum": {
        "max_decimal_places": 6,
        "max_digits": 8,
        "max_terms": 8,
        "min_decimal_places": 4,
        "min_digits": 4,
        "min_terms": 5,
    },
    "dice": {"max_dice_size": 25, "num_dice": 6},
    "emoji_mystery": {"max_words_in_sentence": 30, "min_words_in_sentence": 10},
    "family_relationships": {"max_family_size": 9, "min_family_size": 5},
    "figlet_font": {"max_word_len": 10, "min_word_len": 5},
    "fraction_simplification": {
        "max_factor": 100,
        "max_value": 1000,
        "min_factor": 10,
        "min_value": 100,
    },
    "futoshiki": {
        "max_board_size": 7,
        "max_difficulty": 2,
        "min_board_size": 6,
        "min_difficulty": 1,
    },
    "game_of_life": {
        "filled_cells_weights": 0.2,
        "grid_size_x": 50,
        "grid_size_y": 50,
        "simulation_steps": 2,
    },
    "game_of_life_halting": {
        "difficulty": 2,
        "grid_size_x": 50,
        "grid_size_y": 50,
        "max_simulation_steps": 50,
        "num_oscillators": 7,
    },
    "gcd": {
        "max_numbers": 4,
        "max_value": 10000,
        "min_numbers": 3,
        "min_value": 1000,
    },
    "graph_color": {
        "max_num_vertices": 20,
        "min_num_vertices": 10,
        "num_colors": 4,
    },
    "group_anagrams": {
        "max_anagram_groups": 50,
        "max_words_per_group": 5,
        "min_anagram_groups": 10,
        "min_words_per_group": 2,
    },
    "gsm_symbolic": {},
    "intermediate_integration": {
        "problem_type_weights": [0, 0, 0, 1, 0, 0, 0, 0]
    },
    "isomorphic_strings": {"max_string_length": 100, "min_string_length": 50},
    "jugs": {"difficulty": 10, "num_jugs": 4},
    "knight_swap": {
        "max_nodes": 8,
        "max_pieces": 4,
        "max_steps": 20,
        "min_nodes": 6,
        "min_pieces": 3,
        "min_steps": 1,
    },
    "knights_knaves": {
        "depth_constraint": 3,
        "n_people": 3,
        "width_constraint": 3,
    },
    "largest_island": {
        "max_cols": 50,
        "max_island_size": 20,
        "max_num_islands": 10,
        "max_rows": 50,
        "min_cols": 25,
        "min_island_size": 5,
        "min_num_islands": 5,
        "min_rows": 25,
    },
    "lcm": {
        "max_numbers": 4,
        "max_value": 10000,
        "min_numbers": 3,
        "min_value": 1000,
    },
    "leg_counting": {
        "max_animals": 30,
        "max_instances": 256,
        "min_animals": 20,
        "min_instances": 64,
    },
    "letter_counting": {"max_words": 50, "min_words": 25},
    "letter_jumble": {
        "max_corruption_level": 0.6,
        "max_word_len": 30,
        "max_words": 50,
        "min_corruption_level": 0.3,
        "min_word_len": 5,
        "min_words": 25,
    },
    "list_functions": {},
    "mahjong_puzzle": {"max_num_rounds": 100, "min_num_rounds": 50},
    "manipulate_matrix": {
        "max_cols": 50,
        "max_rows": 50,
        "max_transforms": 10,
        "min_cols": 25,
        "min_rows": 25,
        "min_transforms": 3,
    },
    "maze": {
        "max_dist": 15,
        "max_grid_size": 50,
        "min_dist": 10,
        "min_grid_size": 25,
    },
    "mini_sudoku": {"max_empty": 10, "min_empty": 6},
    "modulo_grid": {
        "max_divisor": 7,
        "max_holes": 5,
        "max_target": 3,
        "size_x": 40,
        "size_y": 40,
    },
    "n_queens": {"max_remove": 6, "min_remove": 4, "n": 8},
    "needle_haystack": {"max_num_statements": 500, "min_num_statements": 100},
    "number_filtering": {
        "max_decimals": 4,
        "max_numbers": 100,
        "max_value": 500,
        "min_decimals": 2,
        "min_numbers": 50,
        "min_value": -500,
    },
    "number_format": {
        "max_delta": 0.001,
        "max_n": 1000000,
        "max_num_candidates": 100,
        "min_n": 100000,
        "min_num_candidates": 25,
    },
    "number_sequence": {
        "max_complexity": 3,
        "max_terms": 10,
        "max_value": 500,
        "min_terms": 5,
        "min_value": -500,
    },
    "number_sorting": {
        "max_decimals": 4,
        "max_numbers": 100,
        "max_value": 500,
        "min_decimals": 2,
        "min_numbers": 50,
        "min_value": -500,
    },
    "palindrome_generation": {"max_length": 100, "min_length": 50},
    "palindrome_partitioning": {
        "max_string_len": 15,
        "max_substring_palindrome_len": 5,
        "min_string_len": 5,
        "min_substring_palindrome_len": 1,
    },
    "polynomial_equations": {
        "max_degree": 3,
        "max_terms": 4,
        "min_degree": 2,
        "min_terms": 3,
    },
    "polynomial_multiplication": {
        "max_degree": 4,
        "max_polynomials": 6,
        "max_terms": 8,
        "max_value": 10000,
        "min_degree": 1,
        "min_polynomials": 3,
        "min_terms": 4,
        "min_value": 10,
    },
    "pool_matrix": {
        "max_cols": 50,
        "max_pool_size": 7,
        "max_rows": 50,
        "min_cols": 25,
        "min_pool_size": 5,
        "min_rows": 25,
    },
    "power_function": {"max_exponent": 8, "min_exponent": 4},
    "prime_factorization": {"max_value": 5000, "min_value": 1000},
    "products": {
        "max_digits": 8,
        "max_terms": 8,
        "min_digits": 4,
        "min_terms": 4,
    },
    "propositional_logic": {
        "max_complexity": 4,
        "max_statements": 8,
        "max_vars": 8,
        "min_complexity": 2,
        "min_statements": 4,
        "min_vars": 4,
    },
    "puzzle24": {"max_value": 6, "min_value": 1},
    "quantum_lock": {"difficulty": 5},
    "ransom_note": {
        "max_magazine_length": 500,
        "max_note_length": 100,
        "min_magazine_length": 100,
        "min_note_length": 50,
    },
    "rearc": {
        "pso_difficulty_weights": [0, 0, 0, 1, 0, 0, 0],
        "rng_difficulty_weights": [0, 0, 0, 1, 0, 0, 0],
    },
    "rectangle_count": {"max_rectangles": 15},
    "rotate_matrix": {
        "max_n": 50,
        "max_rotations": 15,
        "min_n": 25,
        "min_rotations": 5,
    },
    "rotten_oranges": {"max_n": 50, "min_n": 25},
    "rubiks_cube": {
        "cube_size": 5,
        "max_scramble_steps": 50,
        "min_scramble_steps": 25,
    },
    "rush_hour": {"max_moves": 50, "min_moves": 25},
    "self_reference": {"difficulty": 5},
    "sentence_reordering": {
        "max_words_in_sentence": 50,
        "min_words_in_sentence": 20,
    },
    "shortest_path": {
        "max_cols": 50,
        "max_rows": 50,
        "min_cols": 25,
        "min_rows": 25,
    },
    "simple_equations": {
        "max_terms": 10,
        "max_value": 10000,
        "min_terms": 3,
        "min_value": 10,
        "operators_weights": [0.35, 0.35, 0.3],
    },
    "simple_geometry": {"max_sides": 15, "min_sides": 10},
    "simple_integration": {"max_terms": 4, "min_terms": 3},
    "sokoban": {"max_h": 15, "max_w": 15, "min_h": 10, "min_w": 10},
    "spell_backward": {"max_word_len": 20, "min_word_len": 5},
    "spiral_matrix": {"max_n": 50, "min_n": 25},
    "string_insertion": {"max_string_length": 100, "min_string_length": 50},
    "string_manipulation": {"max_string_length": 100, "min_string_length": 50},
    "string_splitting": {
        "max_initial_machines": 100,
        "min_initial_machines": 50,
    },
    "string_synthesis": {"max_initial_blocks": 100, "min_initial_blocks": 50},
    "sudoku": {"max_empty": 50, "min_empty": 30},
    "syllogism": {
        "allow_all": True,
        "allow_no": True,
        "allow_some": False,
        "allow_some_not": False,
    },
    "time_intervals": {
        "max_date_difference_days": 30,
        "max_time_difference_seconds": 21600,
    },
    "tower_of_hanoi": {
        "max_disks": 10,
        "max_pegs": 4,
        "min_disks": 5,
        "min_pegs": 3,
    },
    "tsumego": {"max_board_size": 15, "max_stones": 10, "min_board_size": 5},
    "word_ladder": {"max_word_length": 5, "min_word_length": 3},
    "word_sequence_reversal": {"max_words": 50, "min_words": 25},
    "word_sorting": {
        "max_word_length": 10,
        "max_words": 50,
        "min_word_length": 5,
        "min_words": 25,
    },
    "zebra_puzzles": {"num_characteristics": 5, "num_people": 5},
}

# `RG_GOLDEN_GOOSE` (`spade/core/eval/gem_tasks.py`) by paper column, in its
# order: Math = algebra, arithmetic, geometry, graphs; Algorithmic =
# algorithmic, code; Cognition = arc, games, cognition; Logic = logic,
# induction.
BUCKETS: dict[str, tuple[str, ...]] = {
    "RG:Math": (
        "complex_arithmetic",
        "intermediate_integration",
        "polynomial_equations",
        "polynomial_multiplication",
        "simple_equations",
        "simple_integration",
        "basic_arithmetic",
        "bitwise_arithmetic",
        "calendar_arithmetic",
        "chain_sum",
        "count_bits",
        "decimal_arithmetic",
        "decimal_chain_sum",
        "dice",
        "fraction_simplification",
        "gcd",
        "gsm_symbolic",
        "lcm",
        "leg_counting",
        "number_format",
        "power_function",
        "prime_factorization",
        "products",
        "time_intervals",
        "advanced_geometry",
        "simple_geometry",
        "course_schedule",
        "family_relationships",
        "largest_island",
        "quantum_lock",
        "shortest_path",
    ),
    "RG:Algorithmic": (
        "ab",
        "base_conversion",
        "binary_alternation",
        "binary_matrix",
        "caesar_cipher",
        "count_primes",
        "cryptarithm",
        "game_of_life",
        "game_of_life_halting",
        "graph_color",
        "group_anagrams",
        "isomorphic_strings",
        "jugs",
        "letter_counting",
        "letter_jumble",
        "manipulate_matrix",
        "number_filtering",
        "number_sorting",
        "palindrome_generation",
        "palindrome_partitioning",
        "pool_matrix",
        "ransom_note",
        "rotate_matrix",
        "rotten_oranges",
        "sentence_reordering",
        "spell_backward",
        "spiral_matrix",
        "string_insertion",
        "string_manipulation",
        "string_splitting",
        "string_synthesis",
        "word_ladder",
        "word_sequence_reversal",
        "word_sorting",
        "bf",
        "codeio",
    ),
    "RG:Cognition": (
        "arc_1d",
        "arc_agi",
        "rearc",
        "color_cube_rotation",
        "figlet_font",
        "modulo_grid",
        "needle_haystack",
        "number_sequence",
        "rectangle_count",
        "rubiks_cube",
        "countdown",
        "emoji_mystery",
        "futoshiki",
        "knight_swap",
        "mahjong_puzzle",
        "maze",
        "mini_sudoku",
        "n_queens",
        "puzzle24",
        "rush_hour",
        "sokoban",
        "sudoku",
        "tower_of_hanoi",
        "tsumego",
    ),
    "RG:Logic": (
        "acre",
        "list_functions",
        "aiw",
        "circuit_logic",
        "knights_knaves",
        "propositional_logic",
        "self_reference",
        "syllogism",
        "zebra_puzzles",
    ),
}

# Every task's dataset, as the reference builds it (`gem_adapter.py`).
DATASET_SIZE = 500
DATASET_SEED = 42
# Further draws of an example whose entry fails to generate (`generate`).
REDRAWS = 4

# The environment's observation ends with this (`SpadeReasoningGymEnv.reset`).
OBSERVATION_SUFFIX = "\n\nPut your final answer within \\boxed{}."

# `gem_evaluator._build_initial_prompt`, category "rg".
PROMPT_HEAD = (
    "Given a problem, your task is to answer the question by thinking"
    " step-by-step in a clear and specific manner.\nProblem: "
)
PROMPT_TAIL = (
    "\nOnce you have thought about the reasoning process, provide the answer"
    " in the following format:\n<answer>answer here</answer>\nDo not explain"
    " your reasoning inside the answer tags, provide only the final answer."
    " When an example is provided, you should strictly follow the format of"
    " the output/answer in that example."
)

_ANSWER_TAG = re.compile(
    r"<answer>\s*(.*?)\s*</answer>", re.DOTALL | re.IGNORECASE
)
_BOXED = "\\boxed{"


def bucket_of(task: str) -> str:
  """The paper column ("RG:Math", ...) that `task` is rolled up into."""
  for bucket, tasks in BUCKETS.items():
    if task in tasks:
      return bucket
  raise KeyError(f"{task!r} is not one of the 100 A.3 hard tasks")


def user_prompt(question: str) -> str:
  """The one user turn that poses a reasoning-gym `question`."""
  return PROMPT_HEAD + question + OBSERVATION_SUFFIX + PROMPT_TAIL


def _last_boxed(text: str) -> str | None:
  r"""GEM's `extract_last_boxed_answer`: the last `\boxed`, braces balanced.

  Unlike `answers.last_boxed`, an unclosed last box gives None rather than
  an earlier box, and nothing is stripped.
  """
  start = text.rfind("\\boxed")
  if start < 0:
    return None
  depth = 0
  for i in range(start, len(text)):
    if text[i] == "{":
      depth += 1
    elif text[i] == "}":
      depth -= 1
      if depth == 0:
        boxed = text[start : i + 1]
        return boxed[len(_BOXED) : -1] if boxed.startswith(_BOXED) else None
  return None


def extract_answer(reply: str) -> str | None:
  """The answer the reference scores (module docstring); None when none."""
  tags = _ANSWER_TAG.findall(reply)
  if tags:
    return tags[-1].strip()
  return _last_boxed(reply)


def is_win(reward: float) -> bool:
  """A win is full credit: reward >= 1 (to within float rounding)."""
  return reward >= 1.0 - 1e-9


def bucket_win_rates(
    items: Sequence[registry.ItemResult],
) -> tuple[dict[str, float | None], dict[str, int]]:
  """Per paper column, wins / episodes pooled over its tasks' items.

  Args:
    items: scored items whose `group` is their task's name.

  Returns:
    (win rate per bucket, None where it has no episode; episodes per bucket),
    both keyed by every name of `BUCKETS`, in its order.
  """
  wins = dict.fromkeys(BUCKETS, 0)
  episodes = dict.fromkeys(BUCKETS, 0)
  for item in items:
    bucket = bucket_of(item.group)
    episodes[bucket] += 1
    wins[bucket] += int(item.score >= 1.0)
  rates = {b: wins[b] / n if n else None for b, n in episodes.items()}
  return rates, episodes


@dataclasses.dataclass(frozen=True)
class HardItem:
  """Example `index` of task `task`'s hard dataset, with that dataset.

  `entry` is the dataset's entry `drawn` (`index` unless that entry failed to
  generate: `redrawn` says why); when no entry could be generated, `entry`
  is None and `error` says why.
  """

  task: str
  index: int
  entry: dict | None
  dataset: Any
  drawn: int | None = None
  redrawn: str = ""
  error: str = ""

  @property
  def item_id(self) -> str:
    """ "<task>/<index>", e.g. "chain_sum/0"."""
    return f"{self.task}/{self.index}"


class GenerationError(Exception):
  """A task's generator could not make an entry."""


@contextlib.contextmanager
def _numpy_sum_of_generators() -> Iterator[None]:
  """`np.sum(generator)` as numpy < 2.4 ran it: Python's `sum`.

  numpy 2.4 raises on a generator ("Calling np.sum(generator) is
  deprecated"). codeio's code samples are run to make each entry's I/O
  pair, and some call it (entry 49 of the A.3 dataset); under numpy 2.4
  codeio prints the error and poses a question on an empty I/O pair whose
  answer is "{}". The reference ran them under an earlier numpy (it pins
  none, `numpy>=1.24.0`), so this restores that behaviour while codeio
  makes an entry, for generators only; other calls go to numpy untouched.
  """
  import numpy  # pylint: disable=g-import-not-at-top

  original = numpy.sum

  @functools.wraps(original)
  def sum_(a, *args, **kwargs):
    if not isinstance(a, types.GeneratorType):
      return original(a, *args, **kwargs)
    # numpy < 2.4's `fromnumeric.sum` for a generator: the builtin sum, put
    # into `out` when given; other arguments ignored.
    result = builtins.sum(a)
    out = kwargs.get("out", args[2] if len(args) > 2 else None)
    if out is None:
      return result
    out[...] = result
    return out

  numpy.sum = sum_
  try:
    yield
  finally:
    numpy.sum = original


def _draw(task: str, dataset: Any, index: int) -> dict:
  """The dataset's entry `index`.

  Raises:
    Exception: whatever the task's generator raises; GenerationError when
      codeio's code sample failed (it prints that and returns an empty I/O
      pair rather than raising).
  """
  if task != "codeio":
    return dataset[index]
  printed = io.StringIO()
  with _numpy_sum_of_generators(), contextlib.redirect_stdout(printed):
    entry = dataset[index]
  if "Error" in printed.getvalue():
    raise GenerationError(
        "its code sample failed: " + " ".join(printed.getvalue().split())[:300]
    )
  return entry


def generate(task: str, dataset: Any, index: int) -> HardItem:
  """Example `index` of `task`: the dataset's entry, drawn again on failure.

  Entry `index` is the reference's. When its generator fails (knight_swap
  raises "Failed to generate valid puzzle after trying 100 different
  boards" on 6 of its first 100 entries in reasoning-gym 0.1.25), the
  example is drawn from entry `index + k * len(dataset)`, k = 1, 2, ...,
  `REDRAWS`: past the entries the reference draws from (knight_swap, like
  most tasks, seeds entry i with `DATASET_SEED + i`).
  The redraw is ours: the reference's episode on such an entry raises and
  is counted among its errors (`GemEvaluator.evaluate_all`), so the task
  would be scored on fewer episodes.

  Returns:
    The item; with `entry` None and `error` naming every failure when no
    draw generates.
  """
  failures = []
  for k in range(REDRAWS + 1):
    drawn = index + k * len(dataset)
    try:
      entry = _draw(task, dataset, drawn)
    except Exception as e:  # pylint: disable=broad-exception-caught
      failures.append(f"entry {drawn}: {type(e).__name__}: {e}")
      continue
    return HardItem(task, index, entry, dataset, drawn, "; ".join(failures))
  return HardItem(
      task,
      index,
      None,
      dataset,
      error=(
          f"not generated: reasoning-gym's {task!r} failed on"
          f" {len(failures)} draws ({'; '.join(failures)})"
      ),
  )


def _import_reasoning_gym() -> Any:
  """The `reasoning_gym` module.

  Raises:
    EvalError: it is not installed.
  """
  try:
    import reasoning_gym  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise registry.EvalError(
        "the rg_hard suite needs the `reasoning-gym` package:"
        " pip install 'spade[eval]'"
    ) from e
  return reasoning_gym


def build_dataset(task: str, size: int = DATASET_SIZE) -> Any:
  """`task`'s reasoning-gym dataset at its A.3 hard configuration.

  Raises:
    EvalError: reasoning-gym is missing or cannot build the task.
  """
  reasoning_gym = _import_reasoning_gym()
  try:
    return reasoning_gym.create_dataset(
        task, size=size, seed=DATASET_SEED, **HARD_CONFIGS[task]
    )
  except Exception as e:
    # The package's own `__version__` lags its release (0.1.19 in 0.1.25).
    version = importlib.metadata.version("reasoning-gym")
    raise registry.EvalError(
        f"reasoning-gym {version} cannot build the A.3"
        f" hard task {task!r} with {HARD_CONFIGS[task]} ({e}); all 100"
        " build with reasoning-gym 0.1.25"
    ) from e


class RGHardSuite(registry.SingleTurnSuite):
  """The 100 A.3 hard tasks, won at reward >= 1, rolled up into 4 buckets."""

  name = "rg_hard"
  needs_pool = False

  def __init__(self, eval_config):
    # The items, prompt and rules are the reference's; nothing in
    # `config.eval` changes them (sampling is the responder's).
    del eval_config

  def items(self, num_examples: int) -> list[HardItem]:
    """Examples 0..num_examples-1 of every task, in `HARD_CONFIGS` order.

    A task reasoning-gym cannot build gives items with its `error`, as does
    an example none of whose draws generates (`generate`); `run` records
    them as errors and scores the rest.

    Raises:
      EvalError: reasoning-gym is not installed.
    """
    _import_reasoning_gym()
    result = []
    for task in HARD_CONFIGS:
      try:
        dataset = build_dataset(task, max(DATASET_SIZE, num_examples))
      except registry.EvalError as e:
        result.extend(
            HardItem(task, i, None, None, error=f"not generated: {e}")
            for i in range(num_examples)
        )
        continue
      result.extend(generate(task, dataset, i) for i in range(num_examples))
    return result

  def prompt(self, item: HardItem) -> registry.Messages:
    return [{"role": "user", "content": user_prompt(item.entry["question"])}]

  def score_one(self, item: HardItem, reply: str) -> registry.ItemResult:
    """1.0 when the task's verifier gives the reply's answer full credit.

    Raises:
      Exception: whatever the verifier raises (`run` records it).
    """
    answer = extract_answer(reply)
    reward = float(item.dataset.score_answer(answer=answer, entry=item.entry))
    expected = str(item.entry["answer"])
    return registry.ItemResult(
        item.item_id,
        1.0 if is_win(reward) else 0.0,
        reply,
        f"reward={reward:.3f} answer={str(answer)[:40]!r}"
        f" expected={expected[:40]!r}",
        item.task,
    )

  def score(
      self,
      items: Sequence[HardItem],
      replies: Sequence[str],
      pool: Any = None,
  ) -> list[registry.ItemResult]:
    """Scores every reply; a raising verifier propagates (see `run`)."""
    del pool
    return [self.score_one(i, r) for i, r in zip(items, replies)]

  def run(
      self,
      responder: registry.Responder,
      *,
      num_examples: int,
      pool: Any = None,
      log: registry.Log = print,
  ) -> registry.SuiteResult:
    """Poses every item that fits at once; scores, logs and rolls up.

    As in `GemEvaluator`: a prompt with no room left for a reply is a loss
    without a reply (here: over the responder's `max_prompt_tokens`, when it
    has one and a `render`; cutting it would cut the task and the answer
    format); an episode whose verifier raises, or whose task or entry cannot
    be generated, is an error, logged, listed under `errors` and counted in
    no win rate. Examples drawn from another entry (`generate`) are listed
    under `redrawn`.
    """
    del pool
    if num_examples <= 0:
      raise registry.EvalError(
          f"num_examples={num_examples} (examples per task) must be >= 1"
      )
    log(
        f"[{self.name}] generating {num_examples} example(s) of each of the"
        f" {len(HARD_CONFIGS)} tasks"
    )
    errors, redrawn = [], []
    items = []
    for item in self.items(num_examples):
      if item.error:
        errors.append({"id": item.item_id, "error": item.error})
        log(f"[{self.name}] {item.item_id}: {item.error}")
        continue
      if item.redrawn:
        redrawn.append(
            {"id": item.item_id, "entry": item.drawn, "why": item.redrawn}
        )
        log(
            f"[{self.name}] {item.item_id}: drawn from entry {item.drawn}"
            f" ({item.redrawn})"
        )
      items.append(item)
    prompts = [self.prompt(item) for item in items]
    too_long = _over_budget(responder, prompts)
    posed = [i for i in range(len(items)) if i not in too_long]
    replies = responder.respond([prompts[i] for i in posed])
    if len(replies) != len(posed):
      raise registry.EvalError(
          f"the responder returned {len(replies)} replies for"
          f" {len(posed)} prompts"
      )
    reply_of = dict(zip(posed, replies))
    results = []
    for index, item in enumerate(items):
      if index in too_long:
        result = registry.ItemResult(
            item.item_id, 0.0, "", too_long[index], item.task
        )
      else:
        try:
          result = self.score_one(item, reply_of[index])
        except Exception as e:  # pylint: disable=broad-exception-caught
          error = f"{type(e).__name__}: {e}"
          errors.append({"id": item.item_id, "error": error})
          log(f"[{self.name}] {item.item_id}: verifier error ({error})")
          continue
      results.append(result)
      log(result.log_line(self.name))
    buckets, sizes = bucket_win_rates(results)
    info = {
        "buckets": buckets,
        "bucket_episodes": sizes,
        "examples_per_task": num_examples,
        "not_posed": len(too_long),
        "errors": errors,
        "redrawn": redrawn,
    }
    return registry.SuiteResult(self.name, tuple(results), info)


def _over_budget(
    responder: registry.Responder, prompts: Sequence[registry.Messages]
) -> dict[int, str]:
  """{index: why} of the prompts longer than the responder's prompt budget."""
  budget = getattr(responder, "max_prompt_tokens", None)
  render = getattr(responder, "render", None)
  if budget is None or render is None:
    return {}
  too_long = {}
  for index, messages in enumerate(prompts):
    length = len(render(messages))
    if length > budget:
      too_long[index] = (
          f"not posed: the prompt's {length} tokens exceed the prompt"
          f" budget of {budget}"
      )
  return too_long
