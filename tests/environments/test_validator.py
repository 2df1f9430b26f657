"""The validator: verdicts on good, broken and hostile programs (in-process)."""

import os
import textwrap

import pytest

from spade import config as config_lib
from spade.environments import budget
from spade.environments import contract
from spade.environments import static_check
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
  # The reference's three replies; none of them ends the episode.
  assert v["smoke_steps"] == len(contract.REFERENCE_ACTIONS)
  assert v["properties"] == dict.fromkeys(contract.PROPERTIES, True)
  assert v["notes"] == {} and not v["has_tools"]


def test_reference_fixtures_pass():
  game = validator.validate_program(_fixture("reference_game.py"))
  assert game["valid"], game
  assert game["solution_text"].isdigit()  # the reference's answer string
  assert not game["solution_replayed"]
  assert "cannot be replayed" in game["notes"]["solution_replayed"]
  tool = validator.validate_program(_fixture("reference_tool_use.py"))
  assert tool["valid"], tool
  assert tool["solution_text"].startswith("1. list_warehouses()")
  assert tool["has_tools"]


# Refused as the reference refuses them (or as hostile or over budget); each
# case breaks one thing of GOOD on a path the reference's checks take.
BROKEN = {
    "syntax": GOOD.replace("def step(self, action):", "def step(self, action)"),
    "no_env_class": GOOD.replace("class CoinFlipEnv:", "class CoinFlip:"),
    "load": "import random\nrandom.choice([])\n" + GOOD,
    "init": _with("self.max_turns = max_turns", "self.max_turns = 1 / 0"),
    "reset": _with('or \\\\boxed{{t}}", {}', 'or \\\\boxed{{t}}", []'),
    "step": _with(
        'return "Wrong.", 0.0, False, False, {}', 'return "Wrong.", 0.0'
    ),
    "reward_range": _with(
        'return "Wrong.", 0.0, False, False, {}',
        'return "Wrong.", -11.0, False, False, {}',
    ),
    "close": GOOD + "\n  def close(self):\n    raise RuntimeError('busy')\n",
    "output_too_large": _with(
        'return "Wrong.", 0.0', 'return "Wrong." * 20000, 0.0'
    ),
    "call_timeout": _with("self.turn_count += 1", "while True:\n      pass"),
    "timeout": "while True:\n  pass\n" + GOOD,
    "crash": _with("self.turn_count += 1", "raise SystemExit(3)"),
}


# Over our budgets, not the reference's: the strict ones catch them fast.
STRICT_ONLY = ("call_timeout", "output_too_large")


@pytest.mark.parametrize("reason", sorted(BROKEN))
def test_broken_programs_get_their_reason(reason):
  # A short budget only where the loop needs it: a loaded machine may take
  # seconds over the others.
  seconds = 1.5 if reason == "timeout" else 60.0
  v = validator.validate_program(
      BROKEN[reason],
      time_budget_s=seconds,
      budgets="strict" if reason in STRICT_ONLY else "reference",
  )
  assert not v["valid"]
  assert v["reason"] == reason, v
  assert v["reason"] in contract.REASONS
  assert len(v["message"]) > 10


# Checks the reference does not make: the program stays valid and the
# property is recorded False with a note saying why.
WEAKER = {
    "deterministic": (
        _with("rng = random.Random(seed)", "rng = random.Random()").replace(
            "Guess flip 1 of 3", "Table {rng.random()}: guess flip 1"
        )
    ),
    "seeded": _with("rng = random.Random(seed)", "rng = random.Random(7)"),
    "robust": _with(
        "m = re.search(", "assert '\\\\boxed' in action\n    m = re.search("
    ),
    "rewards_in_unit": _with(
        'return "Wrong.", 0.0, False, False, {}',
        'return "Wrong.", -3.0, False, False, {}',
    ),
    "has_hint": _with('return f"The first flip is', 'return 7 or f"'),
    "solution_replayed": _with(
        'return ["\\\\boxed{%s}" % f for f in self._flips]',
        'return ["\\\\boxed{x}"]',
    ),
}


@pytest.mark.parametrize("prop", sorted(WEAKER))
def test_missing_property_is_recorded_and_required_on_demand(prop):
  v = validator.validate_program(WEAKER[prop])
  assert v["valid"] and v["reason"] == "ok", v
  assert not v["properties"][prop] and len(v["notes"][prop]) > 10
  strict = validator.validate_program(WEAKER[prop], require=(prop,))
  assert not strict["valid"]
  assert strict["reason"] == f"requires_{prop}" in contract.REASONS
  assert v["notes"][prop] in strict["message"]
  # GOOD has every property, so requiring them all keeps it valid.
  assert validator.validate_program(GOOD, require=contract.PROPERTIES)["valid"]


def test_unknown_required_property_is_an_error():
  with pytest.raises(ValueError, match="unknown properties"):
    validator.validate_program(GOOD, require=("fast",))


def test_several_env_classes_take_the_first_as_the_reference_does():
  v = validator.validate_program(GOOD + "\n\nclass OtherEnv:\n  pass\n")
  assert v["valid"] and v["class_name"] == "CoinFlipEnv"
  assert "CoinFlipEnv, OtherEnv" in v["warnings"][0]


def test_hidden_nondeterminism_is_caught_by_the_twin_instance():
  # The first observation is fixed but the flips are not seeded: the twin
  # instance's solution differs from the first one's (7 times in 8).
  source = _with("rng = random.Random(seed)", "rng = random.Random()")
  verdicts = [validator.validate_program(source) for _ in range(6)]
  assert all(v["valid"] for v in verdicts)
  assert not all(v["properties"]["deterministic"] for v in verdicts)


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
  assert v["valid"] and v["properties"]["deterministic"], v


def test_call_budget_comes_from_the_options():
  # A step that burns 0.3 s of CPU time on one of the reference's replies
  # (CPU time, so that a loaded machine neither shortens nor stretches it).
  source = _with(
      "self.turn_count += 1",
      "import time\n    t = time.process_time()\n"
      "    while action == '\\\\boxed{42}' and time.process_time() < t + 0.3:"
      "\n      pass\n    self.turn_count += 1",
  )
  slow = validator.validate_program(
      source, call_timeout_s=0.1, time_budget_s=120.0
  )
  assert slow["reason"] == "call_timeout", slow
  assert "boxed{42}" in slow["message"] and "0.1 s" in slow["message"]
  fine = validator.validate_program(
      source, call_timeout_s=5.0, time_budget_s=120.0
  )
  assert fine["valid"], fine


def test_output_cap_comes_from_the_options():
  v = validator.validate_program(GOOD, max_output_chars=20)
  assert v["reason"] == "output_too_large" and "20 characters" in v["message"]


def test_options_from_config():
  config = config_lib.base_config()
  assert config.sandbox.budgets == "reference"
  # The reference's 30 s a call; an output cap at what the agent's context
  # (768 tokens here) can hold, 8 characters a token.
  assert validator.options_from_config(config) == {
      "budgets": "reference",
      "call_timeout_s": 30.0,
      "max_output_chars": 768 * 8,
      "require": (),
  }
  config.sandbox.budgets = "strict"
  assert validator.options_from_config(config) == {
      "budgets": "strict",
      "call_timeout_s": 0.5,
      "max_output_chars": 65_536,
      "require": (),
  }
  config.sandbox.call_timeout_s = 2.0
  config.environments.require = ("deterministic", "solution_replayed")
  assert validator.options_from_config(config) == {
      "budgets": "strict",
      "call_timeout_s": 2.0,
      "max_output_chars": 65_536,
      "require": ("deterministic", "solution_replayed"),
  }
  config.environments.require = ("deterministic", "fast")
  with pytest.raises(ValueError, match="fast"):
    validator.options_from_config(config)


def test_budget_survives_math_verify_resetting_the_alarm():
  # The reference fixture calls math_verify (signal.alarm inside, which
  # cancels the validator's timer) in step(); an endless loop after it, in
  # the same call and in a later one, must still be stopped.
  fixture = _fixture("reference_game.py")
  same_call = fixture.replace(
      '      msg = f"{cmd} is not a+b+c."\n',
      '      msg = f"{cmd} is not a+b+c."\n'
      '      while cmd == "42":\n'
      "        pass\n",
  )
  later_call = fixture.replace(
      "  def close(self):\n    pass\n",
      "  def close(self):\n    while True:\n      pass\n",
  )
  assert same_call != fixture and later_call != fixture
  v = validator.validate_program(
      same_call, time_budget_s=30.0, budgets="strict"
  )
  assert v["reason"] == "call_timeout" and "boxed{42}" in v["message"], v
  v = validator.validate_program(
      later_call, time_budget_s=30.0, budgets="strict"
  )
  assert v["reason"] == "call_timeout" and "close()" in v["message"], v


# reset() burns CPU time on its first call only (in __init__), so a valid
# verdict costs the burn once, not at every one of the checks' resets.
SLOW_FIRST_RESET = _with(
    "rng = random.Random(seed)",
    "import time\n"
    "    if not CoinFlipEnv.warm:\n"
    "      CoinFlipEnv.warm = True\n"
    "      t = time.process_time()\n"
    "      while time.process_time() < t + 2.0:\n"
    "        pass\n"
    "    rng = random.Random(seed)",
).replace(
    'class CoinFlipEnv:\n  """Guess three hidden coin flips in order."""\n',
    'class CoinFlipEnv:\n  """Guess three hidden coin flips in order."""\n\n  warm = False\n',
)


def test_reference_budgets_accept_a_slow_reset_that_strict_refuses():
  assert "warm = False" in SLOW_FIRST_RESET
  # The reference gives reset() 30 s (ENV_STEP_TIMEOUT) and validate_game
  # 60 s (VALIDATE_GAME_TIMEOUT): 2 s of CPU is within both.
  limits = budget.BUDGETS["reference"]
  assert limits.call_timeout_s == 30.0
  assert budget.VALIDATOR_SHARE * limits.validate_timeout_s == 60.0
  v = validator.validate_program(SLOW_FIRST_RESET)
  assert v["valid"] and v["reason"] == "ok", v
  assert v["properties"] == dict.fromkeys(contract.PROPERTIES, True)
  # Ours: 0.5 s of CPU a call; the first reset runs inside __init__.
  strict = validator.validate_program(SLOW_FIRST_RESET, budgets="strict")
  assert (strict["valid"], strict["reason"]) == (False, "call_timeout")
  assert "CoinFlipEnv()" in strict["message"] and "0.5 s" in strict["message"]


def test_time_running_out_in_the_property_checks_keeps_the_program_valid():
  # The reference's checks (three resets: __init__, seed 0, seed 1) are
  # fast; every later reset burns 0.4 s, so the 1.5 s validation ends in the
  # property checks.
  source = _with(
      "rng = random.Random(seed)",
      "import time\n"
      "    CoinFlipEnv.resets += 1\n"
      "    t = time.process_time()\n"
      "    while CoinFlipEnv.resets > 3 and time.process_time() < t + 0.4:\n"
      "      pass\n"
      "    rng = random.Random(seed)",
  ).replace(
      '  """Guess three hidden coin flips in order."""\n',
      '  """Guess three hidden coin flips in order."""\n\n  resets = 0\n',
  )
  assert "resets = 0" in source
  v = validator.validate_program(source, time_budget_s=1.5)
  assert v["valid"] and v["reason"] == "ok", v
  assert v["smoke_steps"] == len(contract.REFERENCE_ACTIONS)
  unchecked = [p for p, ok in v["properties"].items() if not ok]
  assert "solution_replayed" in unchecked and "has_hint" in unchecked
  for prop in unchecked:
    assert "time budget ran out" in v["notes"][prop], v["notes"]
  # Required, a property not shown refuses the program, as any missing one.
  strict = validator.validate_program(
      source, time_budget_s=1.5, require=("solution_replayed",)
  )
  assert strict["reason"] == "requires_solution_replayed", strict


def test_nondeterminism_is_recorded_not_refused_under_the_defaults():
  v = validator.validate_program(WEAKER["deterministic"])
  assert (v["valid"], v["reason"]) == (True, "ok")
  assert v["properties"]["deterministic"] is False
  assert v["properties"]["seeded"] is False
  assert "different observation" in v["notes"]["deterministic"], v["notes"]


def test_nan_reward_is_a_reward_range_failure_on_any_reply():
  # NaN passes the reference's range test, but poisons returns: refused even
  # on a reply the reference never sends.
  source = _with(
      'return "Wrong.", 0.0, False, False, {}',
      'return "Wrong.", 0.0 if "boxed" in action else float("nan"), False,'
      " False, {}",
  )
  v = validator.validate_program(source)
  assert v["reason"] == "reward_range" and "finite" in v["message"]


def test_solution_that_loses_with_a_terminal_reward():
  source = _with(
      'return "All right!", 1.0, True, False, {}',
      'return "All right!", 0.5, True, False, {}',
  )
  v = validator.validate_program(source)
  assert v["valid"] and not v["solution_replayed"]
  assert "0.5" in v["notes"]["solution_replayed"]


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
  finding = static_check.check(snippet + "\n" + GOOD)
  assert isinstance(finding, static_check.StaticFinding), snippet
  assert finding.reason == "static", snippet
  assert "escape refused" in finding.message
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
  assert static_check.check(GOOD + "\n" + snippet + "\n") is None


def test_static_check_reports_syntax():
  finding = static_check.check("def f(:\n")
  assert finding.reason == "syntax" and finding.lineno == 1


def test_a_late_timer_signal_does_not_kill_the_host():
  """After an in-process validation, a SIGPROF or SIGALRM still pending
  (raised just before the timers were disarmed) is ignored, not the default
  action that terminates the process."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top

  code = textwrap.dedent("""
      import os, signal, sys
      sys.path.insert(0, sys.argv[1])
      from tests.environments.test_validator import GOOD
      from spade.environments import validator
      assert validator.validate_program(GOOD, time_budget_s=60.0)["valid"]
      os.kill(os.getpid(), signal.SIGPROF)
      os.kill(os.getpid(), signal.SIGALRM)
      print("alive")
  """)
  root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
  out = subprocess.run(
      [sys.executable, "-c", code, os.path.abspath(root)],
      capture_output=True, text=True, timeout=120, check=False,
  )  # fmt: skip
  assert out.returncode == 0 and "alive" in out.stdout, out.stderr[-2000:]
