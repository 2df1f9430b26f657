"""What an environment program sees when it runs: the prelude and the loader.

This module runs inside the sandbox worker (gVisor), so it imports only the
standard library at module level; ``numpy`` and ``math_verify`` are bound when
they are importable (``preload()`` imports them once, before the worker forks
environments, since importing them inside gVisor costs ~0.3 s and ~0.9 s).

The prelude mirrors the reference implementation's
(``spade/core/envs/synthetic_game_env.py``): names that generated code often
uses without importing them. ``ToolUseBaseEnv`` reproduces the reference's
``spade/core/envs/tool_use_base_env.py`` behaviour, so tool-use environments
written for the reference load and play unchanged.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import heapq
import itertools
import json
import math
import operator
import random
import re
import statistics
import string
import sys
import types
import typing
from typing import Any

from spade.environments import contract

_PROGRAM_MODULE = "env_program"


class ProgramError(Exception):
  """An environment program that cannot be loaded.

  Attributes:
    reason: a short code from `contract.REASONS` ("syntax", "load",
      "no_env_class").
    message: what was wrong and what to do about it.
  """

  def __init__(self, reason: str, message: str):
    super().__init__(f"{reason}: {message}")
    self.reason = reason
    self.message = message


def _solution_text(solution: Any) -> str:
  """Renders a solution (list of actions or free text) for an observation."""
  if isinstance(solution, (list, tuple)):
    return "\n".join(str(a) for a in solution)
  return str(solution)


class ToolUseBaseEnv:
  """Base environment for tool-use tasks with the <tool_call> protocol.

  The agent interacts by replying with a call such as
  ``<tool_call>{"name": "lookup", "arguments": {"id": "7"}}</tool_call>``
  or submits ``<answer>final result</answer>``.

  Subclasses implement ``reset(seed=None)`` (set ``self._tools``,
  ``self._state`` and ``self._expected_answer``; return ``(observation,
  {})``), ``solution()`` and one ``tool_<name>(**kwargs) -> str`` method per
  tool. The base class handles turn counting, parsing, dispatch, answer
  checking (`_check_answer`, overridable) and truncation, like the reference.
  """

  def __init__(self, max_turns=10, **kwargs):
    del kwargs
    self.max_turns = max_turns
    self.turn_count = 0
    self._tools = {}
    self._state = {}
    self._call_history = []
    self._expected_answer = None
    self.reset()

  def reset(self, seed=None) -> tuple[str, dict]:
    """Generates the task, tools and expected answer; subclasses override."""
    raise NotImplementedError("Subclass must implement reset()")

  def solution(self):
    """Returns the winning actions (or a readable account); override."""
    raise NotImplementedError("Subclass must implement solution()")

  def get_tools(self) -> list[dict[str, Any]]:
    """Returns the tools in OpenAI function-calling format."""
    tools = []
    for name, info in self._tools.items():
      tools.append(
          {
              "type": "function",
              "function": {
                  "name": name,
                  "description": info.get("description", ""),
                  "parameters": info.get(
                      "parameters", {"type": "object", "properties": {}}
                  ),
              },
          }
      )
    return tools

  def execute_tool(self, name: str, arguments: dict[str, Any]) -> dict:
    """Runs one pre-parsed tool call: {"output": str, "returncode": int}."""
    method = getattr(self, f"tool_{name}", None)
    if method is None:
      return {"output": f"Unknown tool '{name}'", "returncode": 1}
    try:
      result = method(**arguments)
      self._call_history.append(
          {"name": name, "arguments": arguments, "result": str(result)}
      )
      return {"output": str(result), "returncode": 0}
    except Exception as e:  # pylint: disable=broad-except
      return {"output": f"Error calling {name}: {e}", "returncode": 1}

  def _time_up(self, prefix: str = "Time up.") -> tuple:
    return (
        f"{prefix} Solution:\n{_solution_text(self.solution())}",
        0.0,
        False,
        True,
        {},
    )

  def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
    """Parses an <answer> or a <tool_call> from the reply and acts on it."""
    self.turn_count += 1
    truncated = self.turn_count >= self.max_turns

    answer_match = re.search(r"<answer>(.*?)</answer>", action, re.DOTALL)
    if answer_match:
      answer = answer_match.group(1).strip()
      if self._check_answer(answer):
        return ("Correct!", 1.0, True, False, {})
      if truncated:
        return self._time_up("Wrong answer.")
      return (self._incorrect_answer_feedback(), 0.0, False, False, {})

    tc_match = re.search(r"<tool_call>(.*?)</tool_call>", action, re.DOTALL)
    if not tc_match:
      if truncated:
        return self._time_up()
      return (
          "Format error: use tools to call a function, "
          "or <answer>result</answer> to submit.",
          contract.FORMAT_ERROR_REWARD,
          False,
          False,
          {},
      )

    try:
      call = json.loads(tc_match.group(1))
      tool_name = call.get("name", "")
      arguments = call.get("arguments", {})
      if not isinstance(arguments, dict):
        arguments = {}
    except (json.JSONDecodeError, AttributeError):
      if truncated:
        return self._time_up()
      return (
          "Format error: invalid tool call arguments.",
          contract.FORMAT_ERROR_REWARD,
          False,
          False,
          {},
      )

    method = getattr(self, f"tool_{tool_name}", None)
    if method is None:
      if truncated:
        return self._time_up()
      avail = ", ".join(self._tools.keys())
      return (
          f"Unknown tool '{tool_name}'. Available: {avail}",
          0.0,
          False,
          False,
          {},
      )

    try:
      result = method(**arguments)
      self._call_history.append(
          {"name": tool_name, "arguments": arguments, "result": str(result)}
      )
    except Exception as e:  # pylint: disable=broad-except
      result = f"Error calling {tool_name}: {e}"

    obs = f"Tool result:\n{result}"
    if truncated:
      obs += f"\n\nTime up. Solution:\n{_solution_text(self.solution())}"
      return (obs, 0.0, False, True, {})
    return (obs, 0.0, False, False, {})

  def _obs_suffix(self) -> str:
    """Kept for programs written against the reference's older base class."""
    return ""

  def _incorrect_answer_feedback(self) -> str:
    """Names the pending step of a multi-step task, as the reference does."""
    base = "Incorrect. Keep using tools."
    msgs = getattr(self, "_user_messages", None)
    idx = getattr(self, "_current_msg", None)
    if (
        isinstance(msgs, (list, tuple))
        and isinstance(idx, int)
        and 0 <= idx < len(msgs)
    ):
      return (
          f"{base} Not all steps are complete — you are still on step "
          f'{idx + 1}/{len(msgs)}: "{msgs[idx]}" Complete this step with the '
          "tools before submitting <answer>done</answer>."
      )
    return base

  def _check_answer(self, answer: str) -> bool:
    """Case-insensitive exact match, else numeric match within 0.01."""
    a = str(answer).strip()
    e = str(self._expected_answer).strip()
    if a.lower() == e.lower():
      return True
    try:
      a_clean = a.replace("$", "").replace(",", "").strip()
      e_clean = e.replace("$", "").replace(",", "").strip()
      return abs(float(a_clean) - float(e_clean)) < 0.01
    except (ValueError, TypeError):
      return False

  def close(self):
    """Nothing to release."""


def _optional_modules() -> dict[str, Any]:
  """numpy and math_verify names, when importable (never required)."""
  names = {}
  try:
    import numpy  # pylint: disable=g-import-not-at-top

    names["np"] = numpy
    names["numpy"] = numpy
  except ImportError:
    pass
  return names


def preload() -> list[str]:
  """Imports the optional modules once (before a worker forks); names them."""
  loaded = []
  for name in ("numpy", "math_verify"):
    try:
      __import__(name)
      loaded.append(name)
    except ImportError:
      pass
  return loaded


_STDLIB_NAMES: dict[str, Any] = {
    "itertools": itertools,
    "math": math,
    "random": random,
    "re": re,
    "json": json,
    "collections": collections,
    "functools": functools,
    "string": string,
    "copy": copy,
    "heapq": heapq,
    "operator": operator,
    "statistics": statistics,
    "dataclasses": dataclasses,
    "dataclass": dataclasses.dataclass,
    "field": dataclasses.field,
    "deque": collections.deque,
    "defaultdict": collections.defaultdict,
    "Counter": collections.Counter,
    "OrderedDict": collections.OrderedDict,
    "namedtuple": collections.namedtuple,
    "combinations": itertools.combinations,
    "permutations": itertools.permutations,
    "product": itertools.product,
    "chain": itertools.chain,
    "accumulate": itertools.accumulate,
    "reduce": functools.reduce,
    "lru_cache": functools.lru_cache,
    "deepcopy": copy.deepcopy,
    "heappush": heapq.heappush,
    "heappop": heapq.heappop,
    "Tuple": typing.Tuple,
    "Dict": typing.Dict,
    "List": typing.List,
    "Optional": typing.Optional,
    "Union": typing.Union,
    "Any": typing.Any,
    "Set": typing.Set,
    "FrozenSet": typing.FrozenSet,
    "Callable": typing.Callable,
    "Iterable": typing.Iterable,
    "Sequence": typing.Sequence,
    "Mapping": typing.Mapping,
}


def prelude() -> dict[str, Any]:
  """Returns a fresh copy of the names pre-bound in every program."""
  names = dict(_STDLIB_NAMES)
  names.update(_optional_modules())
  names["ToolUseBaseEnv"] = ToolUseBaseEnv
  return names


def _register_base_module() -> None:
  """Makes `from tool_use_base_env import ToolUseBaseEnv` work, as upstream."""
  if "tool_use_base_env" not in sys.modules:
    module = types.ModuleType("tool_use_base_env")
    module.ToolUseBaseEnv = ToolUseBaseEnv
    sys.modules["tool_use_base_env"] = module


# Names the reference's loader never takes as the environment: its own base
# classes, injected into every program.
_BASE_CLASS_NAMES = frozenset(("Env", "ToolUseBaseEnv"))


def _pick_env_class(namespace: dict[str, Any]) -> tuple[Any, list[str]]:
  """The reference loader's choice of environment class, and all candidates.

  The reference (``synthetic_game_env.py``) takes the first name, in
  definition order, that ends in "Env" and is callable. A candidate without
  both ``reset`` and ``step`` would fail its checks there, so such a leading
  candidate (a helper or an empty base class) is passed over for the first
  later one that has both: every program the reference accepts picks the
  same class here, and a few it refuses load.
  """
  candidates = [
      (name, obj)
      for name, obj in namespace.items()
      if name.endswith("Env")
      and name not in _BASE_CLASS_NAMES
      and obj is not ToolUseBaseEnv
      and callable(obj)
  ]
  names = [name for name, _ in candidates]
  if not candidates:
    return None, names
  for _, obj in candidates:
    if hasattr(obj, "reset") and hasattr(obj, "step"):
      return obj, names
  return candidates[0][1], names


def load_program_with_candidates(
    source: str, filename: str = "<env>"
) -> tuple[Any, list[str]]:
  """`load_program`, also returning every name that could be the class."""
  if not isinstance(source, str):
    raise ProgramError(
        "syntax", f"the program must be a str of Python, got {type(source)}"
    )
  try:
    code = compile(source, filename, "exec")
  except (SyntaxError, ValueError) as e:
    line = getattr(e, "lineno", None)
    where = f" (line {line})" if line else ""
    raise ProgramError(
        "syntax", f"{type(e).__name__}{where}: {e}; fix the Python syntax"
    ) from None
  _register_base_module()
  # A real module in sys.modules, as upstream: dataclasses (and typing's
  # string annotations) look the defining module up by name.
  module = types.ModuleType(_PROGRAM_MODULE)
  namespace = module.__dict__
  namespace.update(prelude())
  namespace["__file__"] = filename
  sys.modules[_PROGRAM_MODULE] = module
  try:
    exec(code, namespace)  # pylint: disable=exec-used
  except Exception as e:  # pylint: disable=broad-except
    raise ProgramError(
        "load",
        f"module-level code raised {type(e).__name__}: {e}"
        f"{program_line(e, filename)}; keep the top level to imports,"
        " constants and the class",
    ) from None
  cls, names = _pick_env_class(namespace)
  if cls is None:
    raise ProgramError(
        "no_env_class",
        "no class whose name ends in 'Env' was defined; define one (e.g."
        " `class MazeEnv:`)",
    )
  return cls, names


def load_program(source: str, filename: str = "<env>") -> Any:
  """Executes a program with the prelude and returns its environment class.

  Args:
    source: the program's Python source.
    filename: the name tracebacks show for it.

  Returns:
    The class the reference's loader takes: the first defined name ending
    in "Env" (other than the injected base classes) that is callable, passing
    over leading ones without ``reset`` and ``step``.

  Raises:
    ProgramError: with reason "syntax", "load" or "no_env_class" and a
      message for the program's author.
  """
  return load_program_with_candidates(source, filename)[0]


def instantiate(
    cls: Any,
    kwargs: dict[str, Any] | None = None,
    max_turns: int = contract.FALLBACK_MAX_TURNS,
) -> Any:
  """Creates the environment as the reference's player does.

  ``cls(**kwargs)`` first, so the program plays with the turns its designer
  chose; a TypeError (e.g. ``__init__(self, max_turns)`` without a default)
  retries with ``max_turns=max_turns``, as the reference retries with its
  turn budget.

  Args:
    cls: the class `load_program` returned.
    kwargs: keyword arguments for the first try.
    max_turns: the turn budget of the retry.

  Returns:
    The environment instance.
  """
  kwargs = dict(kwargs or {})
  try:
    return cls(**kwargs)
  except TypeError:
    if "max_turns" in kwargs:
      raise
    return cls(**kwargs, max_turns=max_turns)


def reset_result(out: Any) -> tuple[str, Any]:
  """(observation, info) from what reset() returned, as the reference reads it.

  A 2-tuple is (observation, info); a bare str is the observation with info
  {}. Anything else is returned unchanged in the first slot, for the caller's
  type check.
  """
  if isinstance(out, str):
    return out, {}
  if isinstance(out, tuple) and len(out) == 2:
    return out[0], out[1]
  return out, None


def program_line(error: BaseException, filename: str = "<env>") -> str:
  """Returns " (line N)" for the innermost traceback frame in the program."""
  tb = error.__traceback__
  line = None
  while tb is not None:
    if tb.tb_frame.f_code.co_filename == filename:
      line = tb.tb_lineno
    tb = tb.tb_next
  return f" (line {line})" if line else ""
