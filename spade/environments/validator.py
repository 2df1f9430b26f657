"""Validation of environment programs: a static pass and a full in-process run.

`validate_program` runs the program in the calling process. The trainer never
calls it directly on untrusted code: the sandbox worker runs it inside a
forked child in gVisor (`spade.sandbox.SandboxPool.validate`), which enforces
the hard deadline and the memory limit. Standard library only at module level.

`static_check` refuses the file, process, network and introspection escapes
an AST pass can see. It is a filter that gives the designer a clear reason,
not the security boundary: the sandbox stays the real wall.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import inspect
import io
import math
import signal
import threading
import time
from typing import Any

from spade.environments import contract
from spade.environments import runtime

# Modules whose import is refused, by the escape each one is for.
_DENIED_MODULES = {
    **dict.fromkeys(
        "os posix nt shutil pathlib tempfile glob fcntl mmap fileinput"
        " zipfile tarfile sqlite3 shelve dbm".split(),
        "file",
    ),
    **dict.fromkeys(
        "subprocess multiprocessing threading _thread concurrent signal"
        " resource pty pdb faulthandler atexit".split(),
        "process",
    ),
    **dict.fromkeys(
        "socket ssl urllib http requests httpx ftplib smtplib telnetlib"
        " asyncio selectors select xmlrpc webbrowser aiohttp"
        " socketserver".split(),
        "network",
    ),
    **dict.fromkeys(
        "ctypes cffi importlib imp builtins __builtin__ gc inspect code"
        " codeop runpy zipimport marshal pickle".split(),
        "introspection",
    ),
}

# Calls of these builtins are refused.
_DENIED_CALLS = {
    "eval": "introspection",
    "exec": "introspection",
    "compile": "introspection",
    "__import__": "introspection",
    "globals": "introspection",
    "breakpoint": "process",
    "open": "file",
    "input": "process",
    "help": "process",
    "exit": "process",
    "quit": "process",
}

# Attribute names that reach interpreter internals (frames, globals,
# the class graph that leads to every loaded class).
_DENIED_ATTRS = frozenset(
    "__subclasses__ __globals__ __builtins__ __code__ __closure__ __bases__"
    " __base__ __mro__ __self__ __loader__ __spec__ __import__ __reduce__"
    " __reduce_ex__ __getattribute__ __dictoffset__ mro f_globals f_locals"
    " f_back f_builtins f_code gi_frame gi_code cr_frame cr_code ag_frame"
    " tb_frame tb_next func_globals".split()
)

# Names that must not be read or rebound.
_DENIED_NAMES = frozenset("__builtins__ __loader__ __spec__ __import__".split())

# sys attributes that open an escape or end the process.
_DENIED_SYS = frozenset(
    "modules _getframe settrace setprofile exit meta_path path_hooks"
    " path_importer_cache addaudithook _current_frames stdin __stdout__"
    " __stderr__ __stdin__ breakpointhook excepthook setrecursionlimit"
    " monitoring remote_exec".split()
)


@dataclasses.dataclass(frozen=True)
class Verdict:
  """Why a program was refused before it ran.

  Attributes:
    reason: a short code from `contract.REASONS` ("syntax" or "static").
    message: what was wrong and what to do.
    lineno: the program line, when known.
  """

  reason: str
  message: str
  lineno: int | None = None


class _Escapes(ast.NodeVisitor):
  """Collects the first escape attempt the AST shows."""

  def __init__(self):
    self.found: Verdict | None = None
    self._sys_aliases = set()

  def _refuse(self, node: ast.AST, kind: str, what: str) -> None:
    if self.found is None:
      line = getattr(node, "lineno", None)
      self.found = Verdict(
          "static",
          f"{kind} escape refused: {what} (line {line}); environments may"
          " use only in-memory computation with the standard library,"
          " numpy and math_verify",
          line,
      )

  def _check_module(self, node: ast.AST, name: str) -> None:
    top = name.split(".")[0]
    if top in _DENIED_MODULES:
      self._refuse(node, _DENIED_MODULES[top], f"import of {name}")

  def visit_Import(self, node: ast.Import) -> None:  # pylint: disable=invalid-name
    for alias in node.names:
      self._check_module(node, alias.name)
      if alias.name == "sys":
        self._sys_aliases.add(alias.asname or "sys")
    self.generic_visit(node)

  def visit_ImportFrom(self, node: ast.ImportFrom) -> None:  # pylint: disable=invalid-name
    module = node.module or ""
    self._check_module(node, module)
    if module == "sys":
      for alias in node.names:
        if alias.name in _DENIED_SYS:
          self._refuse(node, "introspection", f"from sys import {alias.name}")
    if module == "io":
      for alias in node.names:
        if alias.name in ("open", "FileIO", "open_code"):
          self._refuse(node, "file", f"from io import {alias.name}")
    self.generic_visit(node)

  def visit_Call(self, node: ast.Call) -> None:  # pylint: disable=invalid-name
    func = node.func
    if isinstance(func, ast.Name) and func.id in _DENIED_CALLS:
      self._refuse(node, _DENIED_CALLS[func.id], f"call of {func.id}()")
    if (
        isinstance(func, ast.Name)
        and func.id in ("getattr", "setattr", "delattr", "hasattr")
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
        and (
            node.args[1].value.startswith("__")
            or node.args[1].value in _DENIED_ATTRS
        )
    ):
      self._refuse(
          node,
          "introspection",
          f"{func.id}() of the special attribute {node.args[1].value!r}",
      )
    self.generic_visit(node)

  def visit_Attribute(self, node: ast.Attribute) -> None:  # pylint: disable=invalid-name
    if node.attr in _DENIED_ATTRS:
      self._refuse(node, "introspection", f"attribute .{node.attr}")
    if (
        isinstance(node.value, ast.Name)
        and node.value.id in self._sys_aliases
        and node.attr in _DENIED_SYS
    ):
      self._refuse(node, "introspection", f"sys.{node.attr}")
    if (
        isinstance(node.value, ast.Name)
        and node.value.id == "io"
        and node.attr in ("open", "FileIO", "open_code")
    ):
      self._refuse(node, "file", f"io.{node.attr}")
    self.generic_visit(node)

  def visit_Name(self, node: ast.Name) -> None:  # pylint: disable=invalid-name
    if node.id in _DENIED_NAMES:
      self._refuse(node, "introspection", f"use of the name {node.id}")
    self.generic_visit(node)


def static_check(source: str) -> Verdict | None:
  """Parses a program and looks for escape attempts.

  Args:
    source: the program's Python source.

  Returns:
    None when the program parses and shows no escape; otherwise a `Verdict`
    with reason "syntax" or "static".
  """
  try:
    tree = ast.parse(source)
  except (SyntaxError, ValueError) as e:
    line = getattr(e, "lineno", None)
    return Verdict(
        "syntax",
        f"{type(e).__name__} (line {line}): {e}; fix the Python syntax",
        line,
    )
  visitor = _Escapes()
  visitor.visit(tree)
  return visitor.found


class _Failure(Exception):
  """A validation check that failed; carries the verdict's reason."""

  def __init__(self, reason: str, message: str):
    super().__init__(message)
    self.reason = reason
    self.message = message


class _OutOfTime(BaseException):
  """Raised by the alarm so that `except Exception` in programs misses it."""


class _CappedSink(io.TextIOBase):
  """Swallows what programs print, keeping a short prefix for messages."""

  def __init__(self, cap: int = 2000):
    super().__init__()
    self.kept = []
    self.size = 0
    self._cap = cap

  def write(self, s: str) -> int:
    if self.size < self._cap:
      self.kept.append(s[: self._cap - self.size])
    self.size += len(s)
    return len(s)


# Replies a smoke run feeds a program: both of the reference's formats,
# unparsable text and an empty reply.
SMOKE_ACTIONS = (
    "\\boxed{1}",
    "\\boxed{test}",
    '<tool_call>{"name": "help", "arguments": {}}</tool_call>',
    "<answer>0</answer>",
    "hello",
    "",
    "\\boxed{42}",
    "\\boxed{north}",
)


def _same(a: Any, b: Any) -> bool:
  """Equality that survives values whose == is not a bool (numpy arrays)."""
  try:
    return bool(a == b)
  except Exception:  # pylint: disable=broad-except
    return repr(a) == repr(b)


def _is_bool(x: Any) -> bool:
  # numpy.bool_ is not a bool subclass; generated code often returns one.
  return isinstance(x, bool) or type(x).__name__ == "bool_"


def _is_real(x: Any) -> bool:
  try:
    float(x)
  except (TypeError, ValueError, OverflowError):
    return False
  return not isinstance(x, (str, bytes))


class _Run:
  """One validation: the checks in order, each raising `_Failure`."""

  def __init__(self, source, filename, smoke_steps, max_obs_chars, seed):
    self.source = source
    self.filename = filename
    self.smoke_steps = smoke_steps
    self.max_obs_chars = max_obs_chars
    self.seed = seed
    # Set by validate_program when the SIGALRM budget is armed.
    self.rearm = lambda: None
    self.result = {
        "valid": False,
        "reason": "crash",
        "message": "",
        "has_hint": False,
        "hint": None,
        "solution_text": None,
        "solution_replayed": False,
        "solution_steps": 0,
        "description": "",
        "class_name": "",
        "smoke_steps": 0,
        "warnings": [],
    }

  def _call(self, reason: str, what: str, fn, *args, **kwargs):
    """Calls program code; an exception becomes a `_Failure(reason)`."""
    try:
      out = fn(*args, **kwargs)
      self.rearm()
      return out
    except _OutOfTime:
      raise
    except (Exception, SystemExit) as e:  # pylint: disable=broad-except
      kind = type(e).__name__
      if isinstance(e, SystemExit):
        raise _Failure(
            "crash", f"{what} called exit(); environments must return"
        ) from None
      raise _Failure(
          reason,
          f"{what} raised {kind}: {e}"
          f"{runtime.program_line(e, self.filename)}",
      ) from None

  def _check_obs(self, obs: Any, what: str) -> None:
    if len(obs) > self.max_obs_chars:
      raise _Failure(
          "obs_size",
          f"{what} is {len(obs)} characters, over the limit of"
          f" {self.max_obs_chars}; show a shorter view of the state",
      )

  def _reset(self, env, seed, what="reset()") -> str:
    out = self._call("reset", what, env.reset, seed=seed)
    if (
        not isinstance(out, tuple)
        or len(out) != 2
        or not isinstance(out[0], str)
        or not isinstance(out[1], dict)
    ):
      got = (
          f"a tuple of ({', '.join(type(x).__name__ for x in out)})"
          if isinstance(out, tuple)
          else type(out).__name__
      )
      raise _Failure(
          "reset",
          f"{what} must return (observation: str, info: dict), got {got}",
      )
    if not out[0]:
      raise _Failure("reset", f"{what} returned an empty observation")
    self._check_obs(out[0], f"the observation of {what}")
    return out[0]

  def _step(self, env, action: str, what: str) -> tuple:
    out = self._call("step", what, env.step, action)
    if not isinstance(out, tuple) or len(out) != 5:
      raise _Failure(
          "step",
          f"{what} must return (obs: str, reward: float, terminated: bool,"
          f" truncated: bool, info: dict), got {type(out).__name__}"
          + (f" of length {len(out)}" if isinstance(out, tuple) else ""),
      )
    obs, reward, terminated, truncated, info = out
    problems = []
    if not isinstance(obs, str):
      problems.append(f"obs is {type(obs).__name__}, not str")
    if not _is_real(reward) or _is_bool(reward):
      problems.append(f"reward is {type(reward).__name__}, not float")
    if not _is_bool(terminated):
      problems.append(f"terminated is {type(terminated).__name__}, not bool")
    if not _is_bool(truncated):
      problems.append(f"truncated is {type(truncated).__name__}, not bool")
    if not isinstance(info, dict):
      problems.append(f"info is {type(info).__name__}, not dict")
    if problems:
      raise _Failure("step", f"{what}: " + "; ".join(problems))
    reward = float(reward)
    if not math.isfinite(reward):
      raise _Failure(
          "reward_range",
          f"{what} returned the reward {reward}; rewards" " must be finite",
      )
    if not contract.REWARD_MIN <= reward <= contract.REWARD_MAX:
      raise _Failure(
          "reward_range",
          f"{what} returned the reward {reward}, outside"
          f" [{contract.REWARD_MIN}, {contract.REWARD_MAX}]; pay 1.0 for a"
          " win and keep every step reward within the range",
      )
    self._check_obs(obs, f"the observation of {what}")
    return obs, reward, bool(terminated), bool(truncated), info

  def _smoke(self, env) -> list[tuple]:
    """Feeds `SMOKE_ACTIONS`; returns (obs, reward, terminated, truncated)s."""
    record = []
    for i in range(self.smoke_steps):
      action = SMOKE_ACTIONS[i % len(SMOKE_ACTIONS)]
      out = self._step(env, action, f"step({action!r}) (smoke step {i + 1})")
      record.append(out[:4])
      if out[2] or out[3]:
        break
    return record

  def _not_deterministic(self, what: str) -> _Failure:
    return _Failure(
        "determinism",
        f"two instances reset with seed={self.seed} gave different {what};"
        " the episode must depend on the seed only: draw every random choice"
        " from random.Random(seed) (or call random.seed(seed)) in reset()",
    )

  def run(self) -> None:
    """Runs every check; fills `self.result`."""
    verdict = static_check(self.source)
    if verdict is not None:
      raise _Failure(verdict.reason, verdict.message)
    try:
      cls = runtime.load_program(self.source, self.filename)
    except runtime.ProgramError as e:
      raise _Failure(e.reason, e.message) from None
    self.result["class_name"] = cls.__name__
    self.result["description"] = inspect.cleandoc(cls.__doc__ or "")
    if not self.result["description"]:
      self.result["warnings"].append("the class has no docstring")
    reset_what = f"reset(seed={self.seed})"

    # Episodes are played one after the other, never interleaved: programs
    # in the reference style seed the shared global `random` in reset().
    env = self._call("init", f"{cls.__name__}()", cls)
    first = self._reset(env, self.seed, reset_what)
    played = self._smoke(env)
    self.result["smoke_steps"] = len(played)

    other = self._call("init", f"a second {cls.__name__}()", cls)
    if self._reset(other, self.seed, reset_what) != first:
      raise self._not_deterministic("first observations")
    if self._smoke(other) != played:
      raise self._not_deterministic("answers to the same smoke actions")

    if self._reset(env, self.seed, reset_what) != first:
      raise _Failure(
          "determinism",
          f"reset(seed={self.seed}) after some steps gave a different"
          " observation than the first reset with that seed; reset() must"
          " rebuild the whole episode from the seed",
      )
    hint = getattr(env, "hint", None)
    solution = getattr(env, "solution", None)
    text = self._call("hint", "hint()", hint) if callable(hint) else None
    plan = (
        self._call("solution", "solution()", solution)
        if callable(solution)
        else None
    )
    self._reset(other, self.seed, reset_what)
    if callable(hint):
      if not _same(self._call("hint", "hint()", other.hint), text):
        raise self._not_deterministic("hints")
      if not isinstance(text, str):
        raise _Failure(
            "hint", f"hint() must return a str, got {type(text).__name__}"
        )
      self._check_obs(text, "the hint")
      self.result.update(has_hint=True, hint=text)
    if callable(solution):
      if not _same(self._call("solution", "solution()", other.solution), plan):
        raise self._not_deterministic("solutions")
      self._reset(env, self.seed, reset_what)
      self._check_solution(env, solution)
    for e in (env, other):
      self._call("step", "close()", getattr(e, "close", lambda: None))
    self.result.update(valid=True, reason="ok", message="ok")

  def _check_solution(self, env, solution) -> None:
    """Replays a list solution (it must win); keeps a text one."""
    plan = self._call("solution", "solution()", solution)
    if isinstance(plan, str):
      self._check_obs(plan, "the solution text")
      self.result["solution_text"] = plan
      return
    if not isinstance(plan, (list, tuple)) or not all(
        isinstance(a, str) for a in plan
    ):
      raise _Failure(
          "solution",
          "solution() must return a list of actions (str) that wins, or a"
          f" str describing the win; got {type(plan).__name__}",
      )
    if not plan:
      raise _Failure("solution", "solution() returned an empty list")
    self.result["solution_text"] = "\n".join(plan)
    total = 0.0
    for i, action in enumerate(plan):
      what = f"step {i + 1} of the solution ({action[:60]!r})"
      _, reward, terminated, truncated, _ = self._step(env, action, what)
      total += reward
      if terminated:
        if reward != contract.WIN_REWARD:
          raise _Failure(
              "solution",
              f"the solution's episode ended at {what} with the reward"
              f" {reward}; a win must pay {contract.WIN_REWARD} with"
              " terminated=True",
          )
        self.result.update(
            solution_replayed=True, solution_steps=i + 1, solution_return=total
        )
        if i + 1 < len(plan):
          self.result["warnings"].append(
              f"the solution won after {i + 1} of its {len(plan)} actions"
          )
        return
      if truncated:
        raise _Failure(
            "solution",
            f"the episode was truncated at {what} before the solution won;"
            " allow enough turns (max_turns) for the solution",
        )
    raise _Failure(
        "solution",
        f"all {len(plan)} actions of solution() were played without a win"
        " (terminated=True with reward 1.0); the solution must win the"
        " episode reset() built",
    )


def validate_program(
    source: str,
    *,
    smoke_steps: int = contract.SMOKE_STEPS,
    max_obs_chars: int = contract.MAX_OBS_CHARS,
    seed: int = 0,
    time_budget_s: float = contract.VALIDATE_BUDGET_S,
    filename: str = "<env>",
) -> dict[str, Any]:
  """Checks an environment program by running it in this process.

  Checks, in order: syntax, the static pass, one *Env class, instantiation,
  reset types, observation size, determinism (two instances, same seed, same
  first observation; and again after steps), smoke steps with arbitrary
  replies (types, finite rewards within [-1, 1]), hint() and the solution()
  replay (a list must win: terminated=True with reward 1.0; a str is kept as
  privileged text). Untrusted programs must be validated inside the sandbox
  (`SandboxPool.validate`), never in the trainer.

  Args:
    source: the program's Python source.
    smoke_steps: arbitrary replies to feed before the solution replay.
    max_obs_chars: longest observation (and hint) allowed.
    seed: the seed of the validated episode.
    time_budget_s: in-process budget for the whole check, enforced with
      SIGALRM when called on the main thread (Python-level loops only: the
      sandbox host enforces the hard deadline).
    filename: the program's name in messages and tracebacks.

  Returns:
    A JSON-able dict: valid, reason (from `contract.REASONS`), message,
    has_hint, hint, solution_text, solution_replayed, solution_steps,
    description, class_name, smoke_steps, warnings, printed_chars, elapsed_s.
  """
  if not isinstance(source, str):
    raise TypeError(f"source must be a str of Python, got {type(source)}")
  run = _Run(source, filename, smoke_steps, max_obs_chars, seed)
  sink = _CappedSink()
  start = time.monotonic()
  alarm = threading.current_thread() is threading.main_thread() and hasattr(
      signal, "setitimer"
  )

  def on_alarm(signum, frame):
    del signum, frame
    raise _OutOfTime()

  old_handler = None
  if alarm:
    deadline = start + time_budget_s

    def rearm():
      # math_verify times its parsing with signal.alarm(), which cancels
      # this timer and swaps the handler back and forth: restore both.
      left = deadline - time.monotonic()
      if left <= 0:
        raise _OutOfTime()
      if signal.getsignal(signal.SIGALRM) is not on_alarm:
        signal.signal(signal.SIGALRM, on_alarm)
      if signal.getitimer(signal.ITIMER_REAL)[0] == 0:
        signal.setitimer(signal.ITIMER_REAL, left, 0.25)

    run.rearm = rearm
    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    # Re-fire every 0.25 s: a program's bare `except:` may swallow one.
    signal.setitimer(signal.ITIMER_REAL, time_budget_s, 0.25)
  try:
    with contextlib.redirect_stdout(sink):
      run.run()
  except _Failure as f:
    run.result.update(valid=False, reason=f.reason, message=f.message)
  except _OutOfTime:
    run.result.update(
        valid=False,
        reason="timeout",
        message=(
            f"validation took longer than {time_budget_s} s; a reset or step"
            " must finish in well under a second (look for unbounded loops)"
        ),
    )
  except RecursionError as e:
    run.result.update(
        valid=False, reason="crash", message=f"RecursionError: {e}"
    )
  except Exception as e:  # pylint: disable=broad-except
    # A value the checks could not handle (e.g. a str subclass whose
    # methods raise): refuse the program rather than fail the caller.
    run.result.update(
        valid=False,
        reason="crash",
        message=f"validation stopped on {type(e).__name__}: {e}",
    )
  finally:
    if alarm:
      signal.setitimer(signal.ITIMER_REAL, 0)
      signal.signal(signal.SIGALRM, old_handler)
  if not run.result["valid"] and sink.size:
    printed = "".join(sink.kept)[:300]
    run.result["message"] += f" (the program printed: {printed!r})"
  # Verdicts go back into designer prompts: keep messages short.
  run.result["message"] = run.result["message"][:2000]
  run.result["printed_chars"] = sink.size
  run.result["elapsed_s"] = round(time.monotonic() - start, 4)
  return run.result
