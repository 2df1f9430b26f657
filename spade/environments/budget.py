"""The budgets of a validation run: per call, and for the whole check.

`Clock` measures each call of program code against its budget (CPU time,
and a multiple of it in wall time) and the whole validation against its
deadline, with timer signals where it can; `OutOfTime` is what they raise.
Standard library only (the sandbox worker imports it through the validator).
"""

from __future__ import annotations

import signal
import threading
import time


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
    del signum, frame
    if time.monotonic() >= self.deadline or (self.in_call and self.over()):
      raise OutOfTime()

  def install(self) -> None:
    if self.alarm:
      self._old_handler = (
          signal.signal(signal.SIGALRM, self._on_alarm),
          signal.signal(signal.SIGPROF, self._on_alarm),
      )

  def uninstall(self) -> None:
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
