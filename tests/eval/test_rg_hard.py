"""The rg_hard suite: the reference's 100 A.3 hard tasks, wins and buckets.

All 100 tasks generate at the paper's size (datasets of 500 at seed 42, the
A.3 hard parameters); known-correct answers (each task's own answer, or a
solution built from the entry where the task has many: graph_color,
propositional_logic, rubiks_cube, rush_hour) must all be wins and wrong ones
all losses; an entry that fails to generate is drawn again, and a task or
entry that cannot be generated is an error naming it; the buckets must be
the reference's lists; the CLI must end with the JSON summary.
"""

import collections
import json
import os
import re
import subprocess
import sys

import pytest

from spade.eval import registry
from spade.eval import rg_hard_suite as rg_hard

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))

# `RG_GOLDEN_GOOSE` of spade-rl/spade's spade/core/eval/gem_tasks.py
# (commit 9b2b813), bucket by bucket in its order.
REFERENCE_BUCKETS = {
    "RG:Math": (
        "complex_arithmetic intermediate_integration polynomial_equations"
        " polynomial_multiplication simple_equations simple_integration"
        " basic_arithmetic bitwise_arithmetic calendar_arithmetic chain_sum"
        " count_bits decimal_arithmetic decimal_chain_sum dice"
        " fraction_simplification gcd gsm_symbolic lcm leg_counting"
        " number_format power_function prime_factorization products"
        " time_intervals advanced_geometry simple_geometry course_schedule"
        " family_relationships largest_island quantum_lock shortest_path"
    ),
    "RG:Algorithmic": (
        "ab base_conversion binary_alternation binary_matrix caesar_cipher"
        " count_primes cryptarithm game_of_life game_of_life_halting"
        " graph_color group_anagrams isomorphic_strings jugs letter_counting"
        " letter_jumble manipulate_matrix number_filtering number_sorting"
        " palindrome_generation palindrome_partitioning pool_matrix"
        " ransom_note rotate_matrix rotten_oranges sentence_reordering"
        " spell_backward spiral_matrix string_insertion string_manipulation"
        " string_splitting string_synthesis word_ladder"
        " word_sequence_reversal word_sorting bf codeio"
    ),
    "RG:Cognition": (
        "arc_1d arc_agi rearc color_cube_rotation figlet_font modulo_grid"
        " needle_haystack number_sequence rectangle_count rubiks_cube"
        " countdown emoji_mystery futoshiki knight_swap mahjong_puzzle maze"
        " mini_sudoku n_queens puzzle24 rush_hour sokoban sudoku"
        " tower_of_hanoi tsumego"
    ),
    "RG:Logic": (
        "acre list_functions aiw circuit_logic knights_knaves"
        " propositional_logic self_reference syllogism zebra_puzzles"
    ),
}


def test_buckets_are_the_reference_lists():
  assert {b: len(t) for b, t in rg_hard.BUCKETS.items()} == {
      "RG:Math": 31,
      "RG:Algorithmic": 36,
      "RG:Cognition": 24,
      "RG:Logic": 9,
  }
  assert {b: " ".join(t) for b, t in rg_hard.BUCKETS.items()} == (
      REFERENCE_BUCKETS
  )
  every = [t for tasks in rg_hard.BUCKETS.values() for t in tasks]
  assert sorted(every) == sorted(rg_hard.HARD_CONFIGS)
  assert rg_hard.bucket_of("quantum_lock") == "RG:Math"
  with pytest.raises(KeyError, match="not one of the 100"):
    rg_hard.bucket_of("chain_sum_easy")


def test_configs_are_the_a3_hard_column():
  configs = rg_hard.HARD_CONFIGS
  assert len(configs) == 100
  # Spot values of spade/core/eval/rg_a3_hard.py.
  assert configs["graph_color"] == {
      "max_num_vertices": 20,
      "min_num_vertices": 10,
      "num_colors": 4,
  }
  assert configs["rubiks_cube"]["cube_size"] == 5
  assert configs["acre"] == {} and configs["gsm_symbolic"] == {}
  assert configs["syllogism"]["allow_some"] is False


def _solve_rubiks(scramble: str) -> str:
  """The scramble undone, in moves the task's `expand_moves` keeps.

  It drops moves that start with a layer digit, so "1Lw" (the outer layer
  alone) is written "L" and "2L" (the second layer alone) "Lw L'".
  """
  out = []
  for move in reversed(scramble.split()):
    layer, face, wide, prime = re.fullmatch(
        r"(\d?)([LRDUBF])(w?)(')?", move
    ).groups()
    undo, redo = ("", "'") if prime else ("'", "")
    if layer == "1" and wide:
      out.append(face + undo)
    elif layer == "2" and not wide:
      out += [face + "w" + undo, face + redo]
    else:
      out.append(face + wide + undo)
  return " ".join(out)


def _solve_rush_hour(board: str) -> str:
  """A breadth-first solution of a 6x6 board string, one step per move."""
  cells = collections.defaultdict(list)
  for i, label in enumerate(board):
    if label not in "ox":
      cells[label].append(i)
  walls = {i for i, label in enumerate(board) if label == "x"}
  # The game's Board names piece i chr(65 + i), labels sorted; piece 0 is the
  # red car, home when its left cell is (row 2, column 4).
  pieces = [(len(c), c[1] - c[0]) for _, c in sorted(cells.items())]
  start = tuple(c[0] for _, c in sorted(cells.items()))
  parent = {start: None}
  queue = collections.deque([start])
  while queue:
    state = queue.popleft()
    if state[0] == 2 * 6 + 4:
      moves = []
      while parent[state] is not None:
        state, move = parent[state]
        moves.append(move)
      return " ".join(reversed(moves))
    taken = set(walls)
    for pos, (size, stride) in zip(state, pieces):
      taken.update(pos + k * stride for k in range(size))
    for i, (pos, (size, stride)) in enumerate(zip(state, pieces)):
      for step in (-1, 1):
        cell = pos - stride if step < 0 else pos + size * stride
        same_row = stride == 6 or cell // 6 == pos // 6
        if not (0 <= cell < 36 and same_row) or cell in taken:
          continue
        nxt = state[:i] + (pos + step * stride,) + state[i + 1 :]
        if nxt not in parent:
          parent[nxt] = (state, f"{chr(65 + i)}{'+' if step > 0 else '-'}1")
          queue.append(nxt)
  raise AssertionError(f"rush hour board {board} has no solution")


def _known_answer(item: rg_hard.HardItem) -> str:
  meta = item.entry["metadata"]
  if item.task == "graph_color":
    return json.dumps(meta["possible_answer"])
  if item.task == "propositional_logic":
    return meta["example_answer"]
  if item.task == "rubiks_cube":
    return _solve_rubiks(meta["scramble_moves"])
  if item.task == "rush_hour":
    return _solve_rush_hour(meta["board_config"])
  return item.entry["answer"]


@pytest.fixture(scope="module")
def suite_items():
  """The suite and one item of each of the 100 tasks (builds every task)."""
  suite = registry.build_suite("rg_hard", None)
  items = suite.items(1)
  assert [i.task for i in items] == list(rg_hard.HARD_CONFIGS)
  return suite, items


def test_all_100_generate_at_the_papers_size(suite_items):
  """Every task's dataset is the reference's: 500 entries, seed 42, A.3."""
  _, items = suite_items
  assert not [i.item_id for i in items if i.error or i.redrawn]
  for item in items:
    config = item.dataset.config
    assert (config.size, config.seed) == (500, 42), item.task
    for key, value in rg_hard.HARD_CONFIGS[item.task].items():
      assert getattr(config, key) == value, (item.task, key)
    assert item.drawn == 0 and item.entry["question"]


def test_entries_that_fail_to_generate_are_drawn_again():
  """knight_swap/18 and codeio/49 fail under reasoning-gym 0.1.25, numpy 2.4.

  knight_swap's entry 18 raises "Failed to generate valid puzzle after
  trying 100 different boards" and is drawn from entry 518; codeio's entry
  49 runs `np.sum(generator)`, which numpy 2.4 refuses, so without the shim
  its question would show an empty I/O pair with the answer "{}".
  """
  knight_swap = rg_hard.build_dataset("knight_swap")
  item = rg_hard.generate("knight_swap", knight_swap, 18)
  assert (item.item_id, item.drawn, item.error) == ("knight_swap/18", 518, "")
  assert item.redrawn == (
      "entry 18: ValueError: Failed to generate valid puzzle after trying"
      " 100 different boards"
  )
  assert item.entry == knight_swap[518]
  assert knight_swap.score_answer(item.entry["answer"], item.entry) == 1.0

  codeio = rg_hard.build_dataset("codeio")
  item = rg_hard.generate("codeio", codeio, 49)
  assert (item.drawn, item.redrawn, item.error) == (49, "", "")
  assert json.loads(item.entry["answer"]) == {
      "unstability": pytest.approx(4.337971748731709),
      "convergence_speed": pytest.approx(11.111111111111114),
  }
  assert codeio.score_answer(item.entry["answer"], item.entry) == 1.0


def test_numpy_sum_of_a_generator_is_pythons_sum_inside_codeio_only():
  numpy = pytest.importorskip("numpy")
  original = numpy.sum
  with rg_hard._numpy_sum_of_generators():  # pylint: disable=protected-access
    assert numpy.sum(x * x for x in range(4)) == 14
    out = numpy.zeros(())
    assert numpy.sum((x for x in (1.5, 2.0)), None, None, out) is out
    assert out == 3.5
    assert numpy.sum(numpy.ones((2, 3)), axis=0).tolist() == [2, 2, 2]
  assert numpy.sum is original


class _FakeDataset:
  """A dataset whose entries `fail` raise, as a failing generator does."""

  def __init__(self, task, fail=lambda index: False):
    self.task, self.fail = task, fail

  def __len__(self):
    return rg_hard.DATASET_SIZE

  def __getitem__(self, index):
    if self.fail(index):
      raise ValueError(f"no board for entry {index}")
    return {"question": f"{self.task} {index}?", "answer": str(index)}

  def score_answer(self, answer, entry):
    return float(answer == entry["answer"])


def test_a_task_or_entry_that_cannot_be_generated_is_an_error_naming_it(
    scripted, monkeypatch
):
  """The suite scores the rest; the summary names what was not generated."""

  def build(task, size=rg_hard.DATASET_SIZE):
    assert size == rg_hard.DATASET_SIZE
    if task == "acre":
      raise registry.EvalError("reasoning-gym cannot build 'acre'")
    if task == "knight_swap":  # example 1 never generates, 0 once redrawn
      return _FakeDataset(task, lambda index: index % 500 == 1 or index == 0)
    return _FakeDataset(task)

  monkeypatch.setattr(rg_hard, "build_dataset", build)
  suite = registry.build_suite("rg_hard", None)
  lines = []
  result = suite.run(
      scripted(lambda m: "<answer>0</answer>"),
      num_examples=2,
      log=lines.append,
  )
  summary = result.summary()
  assert [e["id"] for e in summary["errors"]] == [
      "acre/0",
      "acre/1",
      "knight_swap/1",
  ]
  assert summary["errors"][0]["error"] == (
      "not generated: reasoning-gym cannot build 'acre'"
  )
  assert summary["errors"][2]["error"] == (
      "not generated: reasoning-gym's 'knight_swap' failed on 5 draws"
      " (entry 1: ValueError: no board for entry 1; entry 501: ValueError:"
      " no board for entry 501; entry 1001: ValueError: no board for entry"
      " 1001; entry 1501: ValueError: no board for entry 1501; entry 2001:"
      " ValueError: no board for entry 2001)"
  )
  assert summary["redrawn"] == [
      {
          "id": "knight_swap/0",
          "entry": 500,
          "why": "entry 0: ValueError: no board for entry 0",
      }
  ]
  assert "[rg_hard] acre/1: not generated: reasoning-gym cannot" in "\n".join(
      lines
  )
  # Every other example is scored; "0" is right for example 0 only.
  assert summary["num_examples"] == 200 - 3
  assert summary["num_full_score"] == 100 - 2
  assert summary["bucket_episodes"]["RG:Logic"] == 2 * 9 - 2
  assert summary["bucket_episodes"]["RG:Cognition"] == 2 * 24 - 1


def test_without_reasoning_gym_the_suite_says_how_to_install_it(monkeypatch):
  monkeypatch.setitem(sys.modules, "reasoning_gym", None)
  suite = registry.build_suite("rg_hard", None)
  with pytest.raises(registry.EvalError, match=r"pip install 'spade\[eval\]'"):
    suite.items(1)


def _run(suite, items, reply_fn, scripted, monkeypatch):
  monkeypatch.setattr(suite, "items", lambda n: items)
  by_question = {i.entry["question"]: i for i in items}

  def reply(messages):
    (turn,) = messages
    assert turn["role"] == "user"
    question = turn["content"][
        len(rg_hard.PROMPT_HEAD) : -len(
            rg_hard.OBSERVATION_SUFFIX + rg_hard.PROMPT_TAIL
        )
    ]
    return reply_fn(by_question[question])

  return suite.run(scripted(reply), num_examples=1, log=lambda line: None)


def test_known_correct_answers_are_wins(suite_items, scripted, monkeypatch):
  suite, items = suite_items
  result = _run(
      suite,
      items,
      lambda item: f"Step by step...\n<ANSWER> {_known_answer(item)} </Answer>",
      scripted,
      monkeypatch,
  )
  summary = result.summary()
  lost = [i.item_id for i in result.items if i.score != 1.0]
  assert not lost and not summary["errors"], (lost, summary["errors"])
  assert summary["score"] == 1.0 and summary["num_examples"] == 100
  assert summary["redrawn"] == []
  assert summary["buckets"] == dict.fromkeys(rg_hard.BUCKETS, 1.0)
  assert summary["bucket_episodes"] == {
      "RG:Math": 31,
      "RG:Algorithmic": 36,
      "RG:Cognition": 24,
      "RG:Logic": 9,
  }
  assert len(summary["by_group"]) == 100


@pytest.mark.parametrize("reply", ["<answer></answer>", "I don't know."])
def test_wrong_answers_are_losses(reply, suite_items, scripted, monkeypatch):
  suite, items = suite_items
  result = _run(suite, items, lambda item: reply, scripted, monkeypatch)
  summary = result.summary()
  won = [i.item_id for i in result.items if i.score]
  assert not won and not summary["errors"], (won, summary["errors"])
  assert summary["num_examples"] == 100
  assert summary["buckets"] == dict.fromkeys(rg_hard.BUCKETS, 0.0)


def test_verifier_quirks_are_kept_as_the_reference_meets_them(
    suite_items, scripted, monkeypatch
):
  """The tasks' own verifiers decide, oddities included (reasoning-gym 0.1.25).

  game_of_life_halting compares bool(answer) with bool("True"/"False"), so
  any non-empty answer wins; prime_factorization raises on a non-number,
  an error as in the reference; a legal but unfinished rush-hour line earns
  0.01, a loss.
  """
  suite, items = suite_items
  result = _run(
      suite,
      items,
      lambda item: "<answer>no idea</answer>",
      scripted,
      monkeypatch,
  )
  summary = result.summary()
  assert [i.item_id for i in result.items if i.score] == [
      "game_of_life_halting/0"
  ]
  assert [e["id"] for e in summary["errors"]] == ["prime_factorization/0"]
  assert summary["num_examples"] == 99
  assert summary["buckets"]["RG:Algorithmic"] == pytest.approx(1 / 36)
  assert summary["bucket_episodes"]["RG:Math"] == 30
  (rush,) = [i for i in items if i.task == "rush_hour"]
  scored = suite.score_one(rush, "<answer>A-1</answer>")
  assert scored.score == 0.0 and "reward=0.010" in scored.detail


def test_answer_extraction_is_the_references():
  extract = rg_hard.extract_answer
  assert extract("<answer>1</answer> then <Answer>\n 2 \n</ANSWER>") == "2"
  assert extract("so \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"
  assert extract("<answer>3</answer> \\boxed{4}") == "3"
  # GEM's boxed rule: an unclosed last box is no answer, nothing is stripped.
  assert extract("\\boxed{5} and \\boxed{6") is None
  assert extract("\\boxed{ 7 }") == " 7 "
  assert extract("The answer is 8.") is None
  assert rg_hard.is_win(1.0) and not rg_hard.is_win(0.999)


def test_buckets_pool_episodes_not_tasks():
  def item(task, score):
    return registry.ItemResult(f"{task}/0", score, "", "", task)

  # gcd: 2 of 2, lcm: 0 of 1 -> Math pools to 2/3 (a mean of tasks: 1/2).
  items = [item("gcd", 1.0), item("gcd", 1.0), item("lcm", 0.0)]
  rates, sizes = rg_hard.bucket_win_rates(items)
  assert rates == {
      "RG:Math": pytest.approx(2 / 3),
      "RG:Algorithmic": None,
      "RG:Cognition": None,
      "RG:Logic": None,
  }
  assert sizes == {
      "RG:Math": 3,
      "RG:Algorithmic": 0,
      "RG:Cognition": 0,
      "RG:Logic": 0,
  }


def test_a_raising_verifier_is_an_error_outside_the_rates(
    suite_items, scripted, monkeypatch
):
  suite, items = suite_items

  class Raising:

    def score_answer(self, answer, entry):
      raise ValueError("bad entry")

  broken = rg_hard.HardItem("gcd", 0, items[0].entry, Raising())
  (good,) = [i for i in items if i.task == "lcm"]
  monkeypatch.setattr(suite, "items", lambda n: [broken, good])
  result = suite.run(
      scripted(lambda m: f"<answer>{good.entry['answer']}</answer>"),
      num_examples=1,
      log=lambda line: None,
  )
  summary = result.summary()
  assert summary["errors"] == [
      {"id": "gcd/0", "error": "ValueError: bad entry"}
  ]
  assert summary["num_examples"] == 1 and summary["score"] == 1.0
  assert summary["buckets"]["RG:Math"] == 1.0
  assert summary["bucket_episodes"]["RG:Math"] == 1


def test_prompts_over_the_budget_are_losses_not_posed(suite_items, scripted):
  suite, items = suite_items
  (short,) = [i for i in items if i.task == "gcd"]
  (long,) = [i for i in items if i.task == "spiral_matrix"]

  class Budgeted(scripted):
    max_prompt_tokens = 2000

    def render(self, messages):
      return list(messages[0]["content"].encode())

  responder = Budgeted(lambda m: f"<answer>{short.entry['answer']}</answer>")
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(suite, "items", lambda n: [long, short])
    result = suite.run(responder, num_examples=1, log=lambda line: None)
  summary = result.summary()
  assert responder.calls == [1]
  assert summary["not_posed"] == 1 and summary["num_examples"] == 2
  assert summary["by_group"] == {"gcd": 1.0, "spiral_matrix": 0.0}


def test_prompt_is_the_references_rg_prompt(suite_items):
  suite, items = suite_items
  (turn,) = suite.prompt(items[0])
  assert turn["content"].startswith(
      "Given a problem, your task is to answer the question by thinking"
      " step-by-step in a clear and specific manner.\nProblem: "
      + items[0].entry["question"]
      + "\n\nPut your final answer within \\boxed{}.\n"
  )
  assert "<answer>answer here</answer>" in turn["content"]
  with pytest.raises(registry.EvalError, match="examples per task"):
    suite.run(None, num_examples=0)


@pytest.mark.slow
def test_cli_rg_hard(tmp_path):
  workdir = str(tmp_path / "w")
  env = dict(os.environ, XLA_FLAGS=os.environ.get("SPADE_TEST_XLA_FLAGS", ""))
  proc = subprocess.run(
      [
          sys.executable,
          "-m",
          "spade.eval",
          "--config=configs/tiny.py",
          f"--workdir={workdir}",
          "--suite=rg_hard",
          "--num_examples=1",
      ],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=900,
      check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = proc.stdout.strip().splitlines()
  summary = json.loads(lines[-1])
  assert summary["suite"] == "rg_hard"
  assert summary["num_examples"] + len(summary["errors"]) == 100
  assert summary["examples_per_task"] == 1
  assert 0.0 <= summary["score"] <= 1.0
  assert list(summary["buckets"]) == [
      "RG:Math",
      "RG:Algorithmic",
      "RG:Cognition",
      "RG:Logic",
  ]
  assert sum(summary["bucket_episodes"].values()) == summary["num_examples"]
  # The tiny model's 768-token budget holds only the shorter tasks.
  assert 0 < summary["not_posed"] < summary["num_examples"]
  with open(os.path.join(workdir, "eval", "rg_hard.jsonl")) as f:
    assert sum(1 for _ in f) == summary["num_examples"]
