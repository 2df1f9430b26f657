"""The validator: verdicts on good, broken and hostile programs (in-process)."""

import os
import textwrap

import pytest

from spade.environments import contract
from spade.environments import validator

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")

# A minimal valid game; the cases below break one thing each.
GOOD = textwrap.dedent('''
    import random
    import re


    class CoinFlipEnv:
      """Guess three hidden coin flips in order."""

      def __init__(self, max_turns=6, **kwargs):
        self.max_turns = max_turns
        self.reset()

      def reset(self, seed=None):
        rng = random.Random(seed)
        self._flips = [rng.choice("ht") for _ in range(3)]
        self._i = 0
        self.turn_count = 0
        return f"Guess flip 1 of 3 with \\\\boxed{{h}} or \\\\boxed{{t}}", {}

      def step(self, action):
        self.turn_count += 1
        m = re.search(r"\\\\boxed\\{([^}]*)\\}", action)
        if m and m.group(1) == self._flips[self._i]:
          self._i += 1
          if self._i == 3:
            return "All right!", 1.0, True, False, {}
          return f"Right. Flip {self._i + 1}?", 0.0, False, False, {}
        if self.turn_count >= self.max_turns:
          return "Out of turns.", 0.0, False, True, {}
        return "Wrong.", 0.0, False, False, {}

      def hint(self):
        return f"The first flip is {self._flips[0]}."

      def solution(self):
        return ["\\\\boxed{%s}" % f for f in self._flips]
''')


def _with(old, new):
  assert old in GOOD, old
  return GOOD.replace(old, new)


def _fixture(name):
  with open(os.path.join(FIXTURES, name), encoding="utf-8") as f:
    return f.read()


def test_good_program_passes_with_its_fields():
  v = validator.validate_program(GOOD)
  assert v["valid"] and v["reason"] == "ok", v
  assert v["class_name"] == "CoinFlipEnv"
  assert v["description"] == "Guess three hidden coin flips in order."
  assert v["has_hint"] and v["hint"].startswith("The first flip is ")
  assert v["solution_replayed"] and v["solution_steps"] == 3
  assert v["solution_text"].count("\\boxed{") == 3
  assert v["smoke_steps"] == contract.SMOKE_STEPS


def test_reference_fixtures_pass():
  game = validator.validate_program(_fixture("reference_game.py"))
  assert game["valid"], game
  assert game["solution_text"].isdigit()  # the reference's answer string
  assert not game["solution_replayed"]
  tool = validator.validate_program(_fixture("reference_tool_use.py"))
  assert tool["valid"], tool
  assert tool["solution_text"].startswith("1. list_warehouses()")


BROKEN = {
    "syntax": GOOD.replace("def step(self, action):", "def step(self, action)"),
    "no_env_class": GOOD.replace("class CoinFlipEnv:", "class CoinFlip:"),
    "many_env_classes": GOOD + "\n\nclass OtherEnv:\n  pass\n",
    "load": "import random\nrandom.choice([])\n" + GOOD,
    "init": _with("self.max_turns = max_turns", "self.max_turns = 1 / 0"),
    "reset": _with('or \\\\boxed{{t}}", {}', 'or \\\\boxed{{t}}"'),
    "determinism": (
        _with("rng = random.Random(seed)", "rng = random.Random()").replace(
            "Guess flip 1 of 3", "Table {rng.random()}: guess flip 1"
        )
    ),
    "step": _with(
        'return "Wrong.", 0.0, False, False, {}', 'return "Wrong.", 0.0'
    ),
    "reward_range": _with(
        'return "Wrong.", 0.0, False, False, {}',
        'return "Wrong.", 5.0, False, False, {}',
    ),
    "obs_size": _with('return "Wrong.", 0.0', 'return "Wrong." * 10000, 0.0'),
    "hint": _with('return f"The first flip is', 'return 7 or f"'),
    "solution": _with(
        'return ["\\\\boxed{%s}" % f for f in self._flips]',
        'return ["\\\\boxed{x}"]',
    ),
    "timeout": _with("self.turn_count += 1", "while True:\n      pass"),
    "crash": _with("self.turn_count += 1", "raise SystemExit(3)"),
}


@pytest.mark.parametrize("reason", sorted(BROKEN))
def test_broken_programs_get_their_reason(reason):
  # A short budget only where the loop needs it: a loaded machine may take
  # seconds over the others.
  budget = 1.5 if reason == "timeout" else 60.0
  v = validator.validate_program(BROKEN[reason], time_budget_s=budget)
  assert not v["valid"]
  assert v["reason"] == reason, v
  assert v["reason"] in contract.REASONS
  assert len(v["message"]) > 10


def test_hidden_nondeterminism_is_caught_by_the_twin_instance():
  # The first observation is fixed but the flips are not seeded: the twin
  # instance's solution differs from the first one's (7 times in 8).
  source = _with("rng = random.Random(seed)", "rng = random.Random()")
  reasons = {validator.validate_program(source)["reason"] for _ in range(6)}
  assert "determinism" in reasons and reasons <= {"determinism", "ok"}


def test_reference_style_global_random_in_step_is_deterministic():
  # Like the reference's TradingGameEnv: random.seed(seed) in reset() and
  # the global random drawn in step(); replayed alone, it is deterministic.
  source = _with(
      "rng = random.Random(seed)", "random.seed(seed); rng = random"
  ).replace(
      'return "Wrong.", 0.0',
      'return f"Wrong. Wind {random.randint(0, 10**9)}.", 0.0',
  )
  v = validator.validate_program(source)
  assert v["valid"], v


def test_budget_survives_math_verify_resetting_the_alarm():
  # The reference fixture calls math_verify (signal.alarm inside) in step();
  # a later endless loop must still be stopped by the validation budget.
  source = _fixture("reference_game.py").replace(
      "  def solution(self) -> str:\n",
      "  def solution(self) -> str:\n    while self.turn_count >= 0:\n"
      "      pass\n",
  )
  v = validator.validate_program(source, time_budget_s=3.0)
  assert v["reason"] == "timeout", v


def test_nan_reward_is_a_reward_range_failure():
  source = _with(
      'return "Wrong.", 0.0, False, False, {}',
      'return "Wrong.", float("nan"), False, False, {}',
  )
  v = validator.validate_program(source)
  assert v["reason"] == "reward_range" and "finite" in v["message"]


def test_solution_that_loses_with_a_terminal_reward():
  source = _with(
      'return "All right!", 1.0, True, False, {}',
      'return "All right!", 0.5, True, False, {}',
  )
  v = validator.validate_program(source)
  assert v["reason"] == "solution" and "0.5" in v["message"]


def test_messages_name_the_program_line():
  v = validator.validate_program(BROKEN["init"])
  assert v["reason"] == "init"
  assert "ZeroDivisionError" in v["message"] and "(line 10)" in v["message"]


def test_printed_text_is_quoted_in_a_failure():
  source = _with("self.turn_count += 1", "print('debug: turn');1/0")
  v = validator.validate_program(source)
  assert v["reason"] == "step"
  assert v["message"].endswith("(the program printed: 'debug: turn\\n')")


def test_printing_is_swallowed_and_counted():
  source = _with("self.turn_count = 0", "self.turn_count = 0; print('x' * 50)")
  v = validator.validate_program(source)
  assert v["valid"] and v["printed_chars"] >= 150


ESCAPES = [
    "import os",
    "from os import system",
    "import subprocess",
    "import socket",
    "import urllib.request",
    "import ctypes",
    "import importlib",
    "import shutil",
    "from pathlib import Path",
    "x = open('/etc/passwd').read()",
    "x = eval('1')",
    "exec('x = 1')",
    "m = __import__('os')",
    "k = ().__class__.__bases__[0].__subclasses__()",
    "g = (lambda: 0).__globals__",
    "b = getattr(print, '__self__')",
    "import sys\nm = sys.modules['os']",
    "__builtins__['len'] = None",
    "import io\nf = io.open('x')",
    "import threading",
    "import gc",
    "f = input()",
]


@pytest.mark.parametrize("snippet", ESCAPES)
def test_static_pass_refuses_escapes(snippet):
  verdict = validator.static_check(snippet + "\n" + GOOD)
  assert verdict is not None and verdict.reason == "static", snippet
  assert "escape refused" in verdict.message
  v = validator.validate_program(snippet + "\n" + GOOD)
  assert (v["valid"], v["reason"]) == (False, "static")


@pytest.mark.parametrize(
    "snippet",
    [
        "import math, json, collections, itertools",
        "from io import StringIO",
        "import sys\nBIG = sys.maxsize",
        "from dataclasses import dataclass",
        "import numpy as np",
        "NAME = CoinFlipEnv.__name__ if False else 'x'",
    ],
)
def test_static_pass_allows_ordinary_code(snippet):
  assert validator.static_check(GOOD + "\n" + snippet + "\n") is None


def test_static_check_reports_syntax():
  verdict = validator.static_check("def f(:\n")
  assert verdict.reason == "syntax" and verdict.lineno == 1
