"""The budgets of program calls and validations, and the clock that keeps them.

`BUDGETS` names two sets of limits (`sandbox.budgets`): "reference", the
reference implementation's (`spade/core/orchestrator.py`: 30 s for loading
and resetting a game or one `step()` in play, `ENV_STEP_TIMEOUT`; 60 s for
`validate_game`, `VALIDATE_GAME_TIMEOUT`; no cap on what a call returns
beyond what the agent's context can hold), and "strict", ours (0.5 s of CPU
a call, a 65,536-character cap). `resolve` applies a config's explicit keys
over the named set.

`Clock` measures each call of program code against its budget (CPU time,
and a multiple of it in wall time) and the whole validation against its
deadline, with timer signals where it can; `OutOfTime` is what they raise.
Standard library only (the sandbox worker imports it through the validator).
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import NamedTuple

# The most characters one token of text takes, about, with the tokenizers
# used here: an output longer than the agent's context (in tokens) times
# this cannot be held by it, whatever the tokenizer.
CHARS_PER_TOKEN = 8
# The reference's context (--spade-max-context-length 32768), for a
# validation that does not know the agent's.
REFERENCE_CONTEXT_TOKENS = 32768
# The validator's own budget is this fraction of the hard deadline of a
# validation (`SandboxPool.validate`), so a slow program gets a verdict.
VALIDATOR_SHARE = 0.8


class Budgets(NamedTuple):
  """One set of limits on program code.

  Attributes:
    call_timeout_s: one call of program code (`__init__`, `reset`, `step`, a
      tool call, ...), in validation and in play: CPU seconds, and
      `Clock.WALL_FACTOR` times that of wall time.
    validate_timeout_s: the hard deadline of one validation in the sandbox;
      the validator's own budget is `VALIDATOR_SHARE` of it.
    load_timeout_s: loading a program (its module-level code) in play.
    max_output_chars: most characters one call may return at validation;
      None: what the agent's context holds (`output_chars_for`).
  """

  call_timeout_s: float
  validate_timeout_s: float
  load_timeout_s: float
  max_output_chars: int | None


BUDGETS = {
    # ENV_STEP_TIMEOUT = 30 bounds _load_and_reset and every step();
    # VALIDATE_GAME_TIMEOUT = 60 bounds validate_game (75 s x 0.8).
    "reference": Budgets(30.0, 60.0 / VALIDATOR_SHARE, 30.0, None),
    # Ours: a call must be fast, an observation short.
    "strict": Budgets(0.5, 30.0, 5.0, 65_536),
}
DEFAULT = "reference"


def output_chars_for(max_context_tokens: int | None) -> int:
  """The output cap that refuses only what a context cannot hold."""
  tokens = max_context_tokens or REFERENCE_CONTEXT_TOKENS
  return int(tokens) * CHARS_PER_TOKEN


def resolve(
    name: str = DEFAULT,
    *,
    call_timeout_s: float = 0.0,
    validate_timeout_s: float = 0.0,
    load_timeout_s: float = 0.0,
    max_context_tokens: int | None = None,
) -> Budgets:
  """The named budgets, with each explicit value (> 0) in its place.

  Args:
    name: a key of `BUDGETS` (`sandbox.budgets`).
    call_timeout_s: `sandbox.call_timeout_s`; 0: the named value.
    validate_timeout_s: `sandbox.validate_timeout_s`; 0: the named value.
    load_timeout_s: `sandbox.step_timeout_s`; 0: the named value.
    max_context_tokens: the agent's context (`agent.max_context`), which
      sets the output cap where the named one is None.

  Returns:
    Budgets with every field set.

  Raises:
    ValueError: an unknown name.
  """
  if name not in BUDGETS:
    raise ValueError(f"sandbox.budgets={name!r} is not one of {tuple(BUDGETS)}")
  b = BUDGETS[name]
  return Budgets(
      call_timeout_s=float(call_timeout_s or b.call_timeout_s),
      validate_timeout_s=float(validate_timeout_s or b.validate_timeout_s),
      load_timeout_s=float(load_timeout_s or b.load_timeout_s),
      max_output_chars=(
          b.max_output_chars
          if b.max_output_chars is not None
          else output_chars_for(max_context_tokens)
      ),
  )


# The modules whose frames the alarm never interrupts: the clock's and the
# validator's (the code that catches `OutOfTime` and cleans up after it).
_OWN_MODULES = (__name__, "spade.environments.validator")


def _is_own(frame) -> bool:
  """Whether a frame runs in one of `_OWN_MODULES` (by the module's dict,
  which a program cannot pass off as its own by naming itself)."""
  return any(
      m is not None and frame.f_globals is m.__dict__
      for m in map(sys.modules.get, _OWN_MODULES)
  )


class OutOfTime(BaseException):
  """Raised by the alarm so that `except Exception` in programs misses it."""


class Clock:
  """The per-call and whole-validation budgets, with signals when possible.

  A call is over budget when it has used `call_s` seconds of CPU time, or
  `WALL_FACTOR` times that of wall time (a call that sleeps or blocks): CPU
  time is what the program controls, so a loaded host does not turn a fast
  program into an invalid one. ITIMER_PROF (CPU) and ITIMER_REAL (wall, also
  the whole validation's budget) are armed for each call and re-fire every
  `_REFIRE_S` (a program's bare `except:` may swallow one signal).
  math_verify's signal.alarm() cancels ITIMER_REAL but not ITIMER_PROF, and
  a call is also measured when it returns.

  The alarm raises only where it can be caught: never in the validator's
  own frames (`_OWN_MODULES`: its `except` and `finally` blocks, which
  disarm the timers and restore the handlers; the re-fire lands as soon as
  program code runs again), and never once `end()` or `uninstall()` has
  begun (a signal delivered late, or a stale handler, is a no-op). An alarm
  raised there would escape the validation and kill the process that ran it.
  """

  WALL_FACTOR = 4.0
  _REFIRE_S = 0.05

  def __init__(self, budget_s: float, call_s: float):
    self.start = time.monotonic()
    self.deadline = self.start + budget_s
    self.call_s = call_s
    self.call_start = (self.start, time.process_time())
    self.call_limit = None
    self.in_call = False
    self.alarm = threading.current_thread() is threading.main_thread() and (
        hasattr(signal, "setitimer")
    )
    self._old_handler = None

  def over(self) -> bool:
    """Whether the running call is past its budget."""
    if self.call_limit is None:
      return False
    wall, cpu = self.call_start
    return (
        time.process_time() - cpu > self.call_limit
        or time.monotonic() - wall > self.call_limit * self.WALL_FACTOR
    )

  def _on_alarm(self, signum, frame):
    del signum
    if not self.in_call:
      return
    if frame is not None and _is_own(frame):
      return
    if time.monotonic() >= self.deadline or self.over():
      raise OutOfTime()

  def install(self) -> None:
    if self.alarm:
      self._old_handler = (
          signal.signal(signal.SIGALRM, self._on_alarm),
          signal.signal(signal.SIGPROF, self._on_alarm),
      )

  def uninstall(self) -> None:
    self.in_call = False
    if self.alarm:
      signal.setitimer(signal.ITIMER_REAL, 0)
      signal.setitimer(signal.ITIMER_PROF, 0)
      # A timer signal raised just before the disarm can still be pending
      # on another thread; delivered under the default action (terminate)
      # it would kill the host process, so a default handler comes back as
      # "ignore".
      for signum, old in zip(
          (signal.SIGALRM, signal.SIGPROF), self._old_handler
      ):
        keep = old not in (None, signal.SIG_DFL)
        signal.signal(signum, old if keep else signal.SIG_IGN)

  def begin(self, call_s: float | None) -> None:
    """Arms the timers for one call (None: only the whole budget)."""
    now = time.monotonic()
    if now >= self.deadline:
      raise OutOfTime()
    self.call_start = (now, time.process_time())
    self.call_limit = call_s
    self.in_call = True
    if self.alarm:
      # math_verify swaps the handler around its own alarm: take it back.
      if signal.getsignal(signal.SIGALRM) != self._on_alarm:
        signal.signal(signal.SIGALRM, self._on_alarm)
      left = self.deadline - now
      wall = left if call_s is None else min(left, call_s * self.WALL_FACTOR)
      signal.setitimer(signal.ITIMER_REAL, max(1e-3, wall), self._REFIRE_S)
      if call_s is not None:
        signal.setitimer(signal.ITIMER_PROF, max(1e-3, call_s), self._REFIRE_S)

  def end(self) -> None:
    self.in_call = False
    if self.alarm:
      signal.setitimer(signal.ITIMER_REAL, 0)
      signal.setitimer(signal.ITIMER_PROF, 0)
