"""The named budgets (`sandbox.budgets`) and how a config resolves them."""

import signal
import sys
import types

import pytest

from spade import config as config_lib
from spade.environments import budget
from spade.environments import sandboxes
from spade.environments import validator


def test_reference_budgets_are_the_reference_limits():
  ref = budget.resolve("reference", max_context_tokens=24576)
  # ENV_STEP_TIMEOUT = 30 (load + reset, each step); VALIDATE_GAME_TIMEOUT =
  # 60 for the validator, within a hard deadline of 75 s.
  assert ref == budget.Budgets(30.0, 75.0, 30.0, 24576 * 8)
  assert budget.resolve("reference").max_output_chars == 32768 * 8
  assert budget.resolve("strict") == budget.Budgets(0.5, 30.0, 5.0, 65_536)
  # An explicit key (> 0) replaces the named value.
  assert budget.resolve("strict", call_timeout_s=2.0).call_timeout_s == 2.0
  with pytest.raises(ValueError, match="sandbox.budgets"):
    budget.resolve("lenient")


@pytest.mark.parametrize(
    "name, call_s, load_s, validate_s",
    [("reference", 30.0, 30.0, 75.0), ("strict", 0.5, 5.0, 30.0)],
)
def test_pool_from_config_takes_the_named_budgets(
    name, call_s, load_s, validate_s
):
  config = config_lib.base_config()
  config.sandbox.budgets = name
  config.sandbox.backend = "none"
  config.sandbox.num_sandboxes = 1
  config.sandbox.preload = ()
  config.sandbox.warm_spare = False
  config_lib.validate(config)
  with sandboxes.from_config(config.sandbox) as pool:
    o = pool.options
    assert (o.call_timeout_s, o.step_timeout_s, o.validate_timeout_s) == (
        call_s,
        load_s,
        validate_s,
    )


def test_config_refuses_unknown_budgets_and_negative_limits():
  config = config_lib.base_config()
  config.sandbox.budgets = "lenient"
  with pytest.raises(config_lib.ConfigError, match="sandbox.budgets"):
    config_lib.validate(config)
  config = config_lib.base_config()
  config.sandbox.call_timeout_s = -1.0
  with pytest.raises(config_lib.ConfigError, match="call_timeout_s"):
    config_lib.validate(config)


def _frame_in(module_globals):
  """A live frame whose globals are `module_globals` (nothing added to them)."""
  code = (lambda get=sys._getframe: get()).__code__
  return types.FunctionType(code, module_globals, "here", (sys._getframe,))()


def test_the_alarm_raises_only_in_program_frames_while_armed():
  # A deadline already past: whatever frame a signal lands in, the old
  # handler raised. It must not in the validator's own frames (its except
  # and finally blocks disarm the timers), nor once end() has run.
  clock = budget.Clock(budget_s=0.0, call_s=1.0)
  program = types.ModuleType("spade_program").__dict__
  # A program that names itself after the validator is still a program.
  impostor = {"__name__": "spade.environments.validator"}

  clock.in_call = True  # as begin() leaves it
  with pytest.raises(budget.OutOfTime):
    clock._on_alarm(signal.SIGALRM, _frame_in(program))
  with pytest.raises(budget.OutOfTime):
    clock._on_alarm(signal.SIGALRM, _frame_in(impostor))
  clock._on_alarm(signal.SIGALRM, _frame_in(validator.__dict__))
  clock._on_alarm(signal.SIGALRM, _frame_in(budget.__dict__))
  clock.end()
  clock._on_alarm(signal.SIGALRM, _frame_in(program))


def test_timeouts_leave_no_timer_and_no_handler_behind():
  # The crash CI saw: a validation out of time left its alarm armed, which
  # later raised OutOfTime in the test runner's own code and killed it.
  source = "while True:\n  pass\n"
  before = (signal.getsignal(signal.SIGALRM), signal.getsignal(signal.SIGPROF))
  for _ in range(20):
    v = validator.validate_program(source, time_budget_s=0.02)
    assert v["reason"] == "timeout", v
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getitimer(signal.ITIMER_PROF) == (0.0, 0.0)
    after = (signal.getsignal(signal.SIGALRM), signal.getsignal(signal.SIGPROF))
    assert all(
        a == b or (b in (None, signal.SIG_DFL) and a == signal.SIG_IGN)
        for a, b in zip(after, before)
    ), (before, after)
