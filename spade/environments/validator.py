"""Validation of environment programs: a static pass and a full in-process run.

`validate_program` runs the program in the calling process. The trainer never
calls it directly on untrusted code: the sandbox worker runs it inside a
forked child in gVisor (`spade.sandbox.SandboxPool.validate`), which enforces
the hard deadline and the memory limit. Standard library only at module level.

A program is valid when the reference's loader and `validate_game` would
accept it (see `contract`), unless it is hostile or a call runs past its
budget; the stricter checks are recorded as the verdict's `properties`, and
`require` (the config's `environments.require`) makes any of them necessary.

The static pass comes first (static_check.py: the escapes an AST shows, a
filter that gives the designer a clear reason, not the security boundary);
every call of program code then runs within its budget (budget.py; by
default the reference's: 30 s a call, 60 s for the validation, and no output
cap beyond what the agent's context holds; `budgets="strict"` is ours). The
reference's checks run first, on one instance that they close, as its
`validate_game` does; the property checks run after them on fresh
instances, and a validation whose time runs out there stays valid with the
properties not yet shown recorded False.

`reset_gate=True` (the config's `environments.reset_gate`; the reference's
tool-use recipe sets SPADE_RESET_GATE=1) adds the reference's reset gate
after its checks: a program whose tool-use success criteria
(`self._message_criteria`) raise on the state `reset()` builds, at every
seed of `contract.RESET_GATE_SEEDS`, is refused ("criteria_throw_at_reset").
"""

from __future__ import annotations

import contextlib
import inspect
import io
import math
import time
from typing import Any

from spade.environments import budget
from spade.environments import contract
from spade.environments import runtime
from spade.environments import static_check
from spade.environments import tool_calls


class _Reject(Exception):
  """A check that refuses the program; carries the verdict's reason."""

  def __init__(self, reason: str, message: str):
    super().__init__(message)
    self.reason = reason
    self.message = message


class _Raised(Exception):
  """Program code raised (or returned the wrong shape) during a call.

  Checks the reference makes turn it into a `_Reject` with their reason;
  checks that only record a property turn it into that property's note.
  """

  def __init__(self, message: str, reason: str | None = None):
    super().__init__(message)
    self.message = message
    self.reason = reason


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


# Replies a smoke run feeds a program: the reference's own three first (a
# failure there refuses the program, as upstream), then both of the
# reference's formats, unparsable text and an empty reply (a failure there
# only records robust=False: the reference never sends them).
SMOKE_ACTIONS = contract.REFERENCE_ACTIONS + (
    '<tool_call>{"name": "help", "arguments": {}}</tool_call>',
    "<answer>0</answer>",
    "hello",
    "",
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
  if isinstance(x, (str, bytes)):
    return False
  try:
    float(x)
  except (TypeError, ValueError, OverflowError):
    return False
  return True


def _size(x: Any, limit: int, depth: int = 0) -> int:
  """Characters a returned value holds (strings, keys, scalars' reprs).

  Stops counting past `limit`, so a huge value costs no more than the cap.
  """
  if isinstance(x, str):
    return len(x)
  if depth > 20:
    return 0
  total = 0
  if isinstance(x, dict):
    for k, v in x.items():
      total += _size(k, limit, depth + 1) + _size(v, limit, depth + 1)
      if total > limit:
        break
    return total
  if isinstance(x, (list, tuple, set, frozenset)):
    for v in x:
      total += _size(v, limit, depth + 1)
      if total > limit:
        break
    return total
  return min(len(repr(x)), limit + 1) if _is_real(x) or x is None else 8


def _first_line(message: str) -> str:
  return message.split("\n", 1)[0][:300]


def _criteria_and_state(env) -> tuple[list | None, Any]:
  """An instance's `_message_criteria` (as a list; None when empty or
  absent) and its `_state`: program code (properties, `__bool__`), so the
  caller runs it within a call's budget."""
  crits = getattr(env, "_message_criteria", None)
  state = getattr(env, "_state", None)
  return (list(crits) if crits else None), state


class _Run:
  """One validation: the reference's checks, then the recorded properties."""

  def __init__(self, source, filename, options, clock):
    self.source = source
    self.filename = filename
    self.smoke_steps = options["smoke_steps"]
    self.max_output_chars = options["max_output_chars"]
    self.seed = options["seed"]
    self.reset_gate = options.get("reset_gate", False)
    self.clock = clock
    self.properties = dict.fromkeys(contract.PROPERTIES, False)
    self.notes: dict[str, str] = {}
    self.rewards: list[float] = []
    self.result = {
        "valid": False,
        "reason": "crash",
        "message": "",
        "properties": self.properties,
        "notes": self.notes,
        "has_hint": False,
        "hint": None,
        "has_tools": False,
        "solution_text": None,
        "solution_replayed": False,
        "solution_steps": 0,
        "solution_tool_calls": 0,
        "description": "",
        "class_name": "",
        "smoke_steps": 0,
        "warnings": [],
    }

  # -- calls into program code ----------------------------------------------

  def _call(self, what: str, fn, *args, **kwargs):
    """Calls program code within the per-call budget and output cap.

    Raises:
      _Raised: the program raised an exception.
      _Reject: the call ran past its budget ("call_timeout"), returned too
        much ("output_too_large") or exited ("crash").
    """
    out = self._timed(what, fn, *args, **kwargs)
    size = _size(out, self.max_output_chars)
    if size > self.max_output_chars:
      raise _Reject(
          "output_too_large",
          f"{what} returned more than {self.max_output_chars} characters;"
          " show a shorter view of the state",
      )
    return out

  def _timed(self, what: str, fn, *args, **kwargs):
    """Calls program code within the per-call budget, without the output
    cap (for values the agent never sees); raises as `_call` does."""
    self.clock.begin(self.clock.call_s)
    try:
      out = fn(*args, **kwargs)
    except budget.OutOfTime:
      self.clock.end()
      if time.monotonic() >= self.clock.deadline:
        raise
      raise self._too_slow(what) from None
    except SystemExit:
      self.clock.end()
      raise _Reject(
          "crash", f"{what} called exit(); environments must return"
      ) from None
    except Exception as e:  # pylint: disable=broad-except
      self.clock.end()
      raise _Raised(
          f"{what} raised {type(e).__name__}: {e}"
          f"{runtime.program_line(e, self.filename)}"
      ) from None
    over = self.clock.over()
    self.clock.end()
    if over:
      raise self._too_slow(what)
    return out

  def _too_slow(self, what: str) -> _Reject:
    return _Reject(
        "call_timeout",
        f"{what} ran past the per-call budget of {self.clock.call_s} s of"
        f" CPU time ({self.clock.call_s * self.clock.WALL_FACTOR:g} s of wall"
        " time); a reset, step or tool call must finish quickly (look for"
        " unbounded loops or brute-force searches)",
    )

  def _reset(self, env, seed) -> str:
    """reset(seed=seed): its observation; `_Raised` on a wrong shape."""
    what = f"reset(seed={seed})"
    obs, info = runtime.reset_result(self._call(what, env.reset, seed=seed))
    if not isinstance(obs, str) or not isinstance(info, dict):
      shape = (
          f"({type(obs).__name__}, {type(info).__name__})"
          if info is not None
          else type(obs).__name__
      )
      raise _Raised(
          f"{what} must return (observation: str, info: dict) or an"
          f" observation str, got {shape}"
      )
    if not obs:
      raise _Raised(f"{what} returned an empty observation")
    return obs

  def _step(self, env, action: str, what: str) -> tuple:
    """step(action), type- and range-checked; `_Raised` on a bad result."""
    out = self._call(what, env.step, action)
    if not isinstance(out, tuple) or len(out) != 5:
      raise _Raised(
          f"{what} must return (obs: str, reward: float, terminated: bool,"
          f" truncated: bool, info: dict), got {type(out).__name__}"
          + (f" of length {len(out)}" if isinstance(out, tuple) else "")
      )
    obs, reward, terminated, truncated, info = out
    problems = []
    if not isinstance(obs, str):
      problems.append(f"obs is {type(obs).__name__}, not str")
    if not _is_real(reward):
      problems.append(f"reward is {type(reward).__name__}, not float")
    if not _is_bool(terminated):
      problems.append(f"terminated is {type(terminated).__name__}, not bool")
    if not _is_bool(truncated):
      problems.append(f"truncated is {type(truncated).__name__}, not bool")
    if not isinstance(info, dict):
      problems.append(f"info is {type(info).__name__}, not dict")
    if problems:
      raise _Raised(f"{what}: " + "; ".join(problems))
    reward = float(reward)
    message = (
        f"{what} returned the reward {reward}; rewards must be finite and"
        f" within [{contract.REWARD_MIN:g}, {contract.REWARD_MAX:g}]; pay"
        f" {contract.WIN_REWARD} for a win"
    )
    # NaN and inf pass the reference's range test (comparisons with NaN are
    # false) but would poison every return they enter: refused on any reply.
    if not math.isfinite(reward):
      raise _Reject("reward_range", message)
    if not contract.REWARD_MIN <= reward <= contract.REWARD_MAX:
      raise _Raised(message, reason="reward_range")
    self.rewards.append(reward)
    return obs, reward, bool(terminated), bool(truncated)

  def _note(self, prop: str, message: str) -> None:
    self.properties[prop] = False
    self.notes.setdefault(prop, message[:500])

  # -- the checks -------------------------------------------------------------

  def run(self) -> None:
    """Runs every check; fills `self.result`."""
    finding = static_check.check(self.source)
    if finding is not None:
      raise _Reject(finding.reason, finding.message)
    self.clock.begin(None)
    try:
      cls, names = runtime.load_program_with_candidates(
          self.source, self.filename
      )
    except runtime.ProgramError as e:
      raise _Reject(e.reason, e.message) from None
    except SystemExit:
      raise _Reject(
          "crash", "module-level code called exit(); environments must return"
      ) from None
    finally:
      self.clock.end()
    name = getattr(cls, "__name__", names[0])
    self.result["class_name"] = name
    if len(names) > 1:
      self.result["warnings"].append(
          f"several names end in 'Env' ({', '.join(names)}); {name} is the"
          " environment, as the reference's loader takes it"
      )
    self.result["description"] = inspect.cleandoc(
        getattr(cls, "__doc__", None) or ""
    )
    if not self.result["description"]:
      self.result["warnings"].append("the class has no docstring")

    # The reference's checks (validate_game): a failure refuses the program.
    # Episodes are played one after the other, never interleaved: programs
    # in the reference style seed the shared global `random` in reset().
    env = self._hard("init", lambda: self._new(cls, name))
    first = self._hard("reset", lambda: self._reset(env, self.seed))
    played = self._hard("step", lambda: self._smoke(env, reference=True))
    self.result["smoke_steps"] = len(played)
    other_seed = self.seed + 1
    second = self._hard("reset", lambda: self._reset(env, other_seed))
    if callable(getattr(env, "close", None)):
      self._hard("close", lambda: self._call("close()", env.close))
    if self.reset_gate:
      self._check_reset_gate(cls, name)

    # What the reference does not check: recorded as properties. Out of
    # time here, the program stays valid and what was not shown is False.
    try:
      self._check_properties(cls, name, first, second)
    except budget.OutOfTime:
      self.clock.end()
      for prop in contract.PROPERTIES:
        if not self.properties[prop] and prop not in self.notes:
          self._note(
              prop,
              "not checked: the validation's time budget ran out after the"
              " reference's checks had passed",
          )
    else:
      in_unit = all(-1 <= r <= 1 for r in self.rewards)
      self.properties["rewards_in_unit"] = in_unit
      if not in_unit:
        self._note(
            "rewards_in_unit",
            "some rewards were outside [-1, 1]: "
            + ", ".join(
                f"{r:g}" for r in sorted(set(self.rewards)) if abs(r) > 1
            )[:200],
        )
    self.result.update(valid=True, reason="ok", message="ok")

  def _check_reset_gate(self, cls, name: str) -> None:
    """The reference's reset gate (`criteria_throw_at_reset`).

    As `spade/core/envs/synthetic_game_env.py` does: a fresh instance per
    seed of `contract.RESET_GATE_SEEDS`, reset with it (an instance or a
    reset that fails skips that seed), then every `_message_criteria`
    callable on its `_state`, stopping at the first that raises. Refuses
    only when, at every seed that could be checked, some criterion raised:
    a throw at some seeds only depends on the data and is kept. A program without
    criteria or state (games, single-task tool use) passes, as do criteria
    that are already True or merely False. Calls keep their budgets.

    Raises:
      _Reject: "criteria_throw_at_reset", or "timeout" when the
        validation's time runs out in the gate.
    """
    try:
      checked = threw = 0
      first_error = ""
      for seed in contract.RESET_GATE_SEEDS:
        try:
          env = self._new(cls, name)
          self._reset(env, seed)
        except _Raised:
          continue
        try:
          crits, state = self._timed(
              "reading _message_criteria and _state",
              lambda e=env: _criteria_and_state(e),
          )
        except _Raised:
          return  # upstream: any other failure is skipped, never a refusal
        if not crits or state is None:
          return
        checked += 1
        for i, criterion in enumerate(crits):
          try:
            self._timed(f"_message_criteria[{i}](state)", criterion, state)
          except _Raised as e:
            threw += 1
            if not first_error:
              first_error = f"at seed {seed}, {_first_line(e.message)}"
            break
    except budget.OutOfTime:
      self.clock.end()
      raise _Reject(
          "timeout",
          "validation ran out of time in the reset gate"
          " (environments.reset_gate) after the reference's checks had"
          " passed; reset() and the success criteria must be quick",
      ) from None
    if checked and threw == checked:
      raise _Reject(
          "criteria_throw_at_reset",
          "a success criterion raises on the state reset() builds at every"
          f" tested seed {contract.RESET_GATE_SEEDS} ({first_error}), so"
          " that step can never be completed; every callable in"
          " self._message_criteria must return True or False on"
          " self._state as reset() leaves it (read only keys reset() sets,"
          " compare values of the types the tools store)",
      )

  def _check_properties(self, cls, name: str, first: str, second: str):
    """The stricter checks, on a fresh instance (and its twin)."""
    try:
      probe = self._new(cls, name)
    except _Raised as e:
      for prop in contract.PROPERTIES:
        if prop != "rewards_in_unit":
          self._note(prop, f"a second {name}(): {e.message}")
      return
    self._check_robust(probe)
    twin = self._check_deterministic(cls, name, probe, first)
    self._check_seeded(probe, first, second)
    self._check_hint(probe)
    self._check_solution(probe)
    for e in (probe, twin):
      if e is not None and callable(getattr(e, "close", None)):
        try:
          self._call("close()", e.close)
        except _Raised as err:
          self.result["warnings"].append(_first_line(err.message))

  def _hard(self, reason: str, fn):
    """Runs a reference check: a program error refuses with `reason`."""
    try:
      return fn()
    except _Raised as e:
      raise _Reject(e.reason or reason, e.message) from None

  def _new(self, cls, name: str):
    return self._call(f"{name}()", runtime.instantiate, cls)

  def _smoke(self, env, reference: bool) -> list[tuple]:
    """Plays the smoke replies; returns (obs, reward, terminated, truncated)s.

    reference=True plays the reference's replies only (stopping when the
    episode ends); False plays the rest of `SMOKE_ACTIONS`, resetting with
    the validated seed whenever an episode ends.
    """
    n = len(contract.REFERENCE_ACTIONS)
    actions = (
        SMOKE_ACTIONS[:n]
        if reference
        else SMOKE_ACTIONS[n : max(n, self.smoke_steps)]
    )
    record = []
    for i, action in enumerate(actions):
      what = f"step({action!r})"
      out = self._step(env, action, what)
      record.append(out)
      if out[2] or out[3]:
        if reference:
          break
        if i + 1 < len(actions):
          self._reset(env, self.seed)
    return record

  def _check_robust(self, env) -> None:
    try:
      self._reset(env, self.seed)
      self._smoke(env, reference=False)
      self.properties["robust"] = True
    except _Raised as e:
      self._note(
          "robust",
          f"{_first_line(e.message)}; the reference's checks never send this"
          " reply, but agents do: answer every reply with a 5-tuple",
      )

  def _episode(self, env) -> list:
    """One deterministic probe: reset, every smoke reply, hint, solution."""
    record = [self._reset(env, self.seed)]
    for action in SMOKE_ACTIONS[: max(self.smoke_steps, 3)]:
      try:
        out = self._step(env, action, f"step({action!r})")
      except _Raised as e:
        out = _first_line(e.message)
      record.append(out)
      if isinstance(out, tuple) and (out[2] or out[3]):
        break
    record.append(self._reset(env, self.seed))
    for method in ("hint", "solution"):
      fn = getattr(env, method, None)
      if callable(fn):
        try:
          record.append(repr(self._call(f"{method}()", fn)))
        except _Raised as e:
          record.append(_first_line(e.message))
    return record

  def _check_deterministic(self, cls, name, env, first):
    """Two instances, one seed: the same observations, rewards and hints."""
    try:
      twin = self._new(cls, name)
    except _Raised as e:
      self._note("deterministic", f"a second {name}(): {e.message}")
      return None
    try:
      mine = self._episode(env)
      theirs = self._episode(twin)
    except _Raised as e:
      self._note("deterministic", _first_line(e.message))
      return twin
    if mine[0] != first:
      self._note(
          "deterministic",
          f"reset(seed={self.seed}) after some steps gave a different"
          " observation than the first reset with that seed; reset() must"
          " rebuild the whole episode from the seed",
      )
    elif not _same(mine, theirs):
      diff = (
          next(
              i for i, (a, b) in enumerate(zip(mine, theirs)) if not _same(a, b)
          )
          if len(mine) == len(theirs)
          else min(len(mine), len(theirs))
      )
      self._note(
          "deterministic",
          f"two instances reset with seed={self.seed} differed (at probe"
          f" {diff}: {str(mine[diff] if diff < len(mine) else '-')[:80]!r});"
          " draw every random choice from random.Random(seed) (or call"
          " random.seed(seed)) in reset()",
      )
    else:
      self.properties["deterministic"] = True
    return twin

  def _check_seeded(self, env, first, second) -> None:
    if not self.properties["deterministic"]:
      self._note("seeded", "not deterministic for one seed")
      return
    if second != first:
      self.properties["seeded"] = True
      return
    # The first observation may be a fixed preamble: compare solutions.
    fn = getattr(env, "solution", None)
    try:
      if callable(fn):
        self._reset(env, self.seed + 1)
        a = repr(self._call("solution()", fn))
        self._reset(env, self.seed)
        if a != repr(self._call("solution()", fn)):
          self.properties["seeded"] = True
          return
    except _Raised:
      pass
    self._note(
        "seeded",
        f"seeds {self.seed} and {self.seed + 1} gave the same episode; draw"
        " the task from the seed so that episodes differ",
    )

  def _check_hint(self, env) -> None:
    hint = getattr(env, "hint", None)
    if not callable(hint):
      self._note("has_hint", "no hint() method")
      return
    try:
      self._reset(env, self.seed)
      text = self._call("hint()", hint)
    except _Raised as e:
      self._note("has_hint", _first_line(e.message))
      return
    # An empty str is a hint too: one that acts through the state hint()
    # changed (the micro-world's types digits for the player), not text.
    if not isinstance(text, str):
      self._note(
          "has_hint", f"hint() must return a str, got {type(text).__name__}"
      )
      return
    self.properties["has_hint"] = True
    self.result.update(has_hint=True, hint=text)

  def _has_tools(self, env) -> bool:
    get_tools = getattr(env, "get_tools", None)
    if not callable(get_tools):
      return False
    try:
      return bool(self._call("get_tools()", get_tools))
    except _Raised:
      return False

  def _check_solution(self, env) -> None:
    """Replays a list solution by the reference's play rules; keeps text."""
    solution = getattr(env, "solution", None)
    if not callable(solution):
      self._note("solution_replayed", "no solution() method")
      return
    try:
      self._reset(env, self.seed)
      has_tools = self._has_tools(env)
      self.result["has_tools"] = has_tools
      plan = self._call("solution()", solution)
    except _Raised as e:
      self._note("solution_replayed", _first_line(e.message))
      return
    if isinstance(plan, str):
      self.result["solution_text"] = plan
      self._note(
          "solution_replayed",
          "solution() returned text, which cannot be replayed; return the"
          " list of replies that win",
      )
      return
    if not isinstance(plan, (list, tuple)) or not plan:
      self._note(
          "solution_replayed",
          "solution() must return a non-empty list of replies (or a text),"
          f" got {type(plan).__name__}",
      )
      return
    self.result["solution_text"] = "\n".join(
        a if isinstance(a, str) else repr(a) for a in plan
    )[: self.max_output_chars]
    try:
      self._replay(env, plan, has_tools)
    except _Raised as e:
      self._note("solution_replayed", _first_line(e.message))

  def _replay(self, env, plan, has_tools) -> None:
    steps = calls = 0
    for i, item in enumerate(plan):
      where = f"item {i + 1} of the solution"
      if isinstance(item, dict) and "name" in item:
        actions = [("tool", item)]
      elif isinstance(item, str):
        actions = tool_calls.reply_actions(item, has_tools)
      else:
        raise _Raised(
            f"{where} is a {type(item).__name__}; items are replies (str)"
            " or tool calls ({'name': ..., 'arguments': {...}})"
        )
      for kind, action in actions:
        if kind == "tool":
          execute = getattr(env, "execute_tool", None)
          if not callable(execute):
            raise _Raised(
                f"{where} is a tool call but there is no execute_tool"
            )
          out = self._call(
              f"execute_tool({action['name']!r}) at {where}",
              execute,
              action["name"],
              action.get("arguments", {}),
          )
          if not isinstance(out, dict):
            raise _Raised(
                f"execute_tool at {where} returned {type(out).__name__}, not"
                " a dict with 'output'"
            )
          calls += 1
          continue
        what = f"step({action[:60]!r}) at {where}"
        _, reward, terminated, truncated = self._step(env, action, what)
        steps += 1
        if terminated:
          if reward != contract.WIN_REWARD:
            raise _Raised(
                f"the solution's episode ended at {what} with the reward"
                f" {reward}; a win pays {contract.WIN_REWARD} with"
                " terminated=True"
            )
          self.properties["solution_replayed"] = True
          self.result.update(
              solution_replayed=True,
              solution_steps=steps,
              solution_tool_calls=calls,
          )
          if i + 1 < len(plan):
            self.result["warnings"].append(
                f"the solution won after {i + 1} of its {len(plan)} items"
            )
          return
        if truncated:
          raise _Raised(
              f"the episode was truncated at {what} before the solution won;"
              " allow enough turns (max_turns) for the solution"
          )
    raise _Raised(
        f"all {len(plan)} items of solution() were played without a win"
        " (terminated=True with reward 1.0); replies that the game does not"
        " parse (e.g. a move without \\boxed{}) do not count"
    )


def options_from_config(config) -> dict[str, Any]:
  """Validator options from a SPADE config (`sandbox`, `environments`).

  The per-call budget and the output cap of `sandbox.budgets` (with
  `sandbox.call_timeout_s` over it when > 0); under "reference" the cap is
  what the agent's context holds (`agent.max_context` tokens at
  `budget.CHARS_PER_TOKEN` characters a token), and
  `environments.reset_gate` (absent: off). Pass them to
  `SandboxPool.validate(sources, **options)`; keys missing from an older
  config keep the validator's defaults.
  """
  options = {}
  sandbox = getattr(config, "sandbox", None)
  if sandbox is not None and "budgets" in sandbox:
    agent = getattr(config, "agent", None)
    limits = budget.resolve(
        sandbox.budgets,
        call_timeout_s=sandbox.get("call_timeout_s", 0.0),
        max_context_tokens=agent.get("max_context") if agent else None,
    )
    options["budgets"] = sandbox.budgets
    options["call_timeout_s"] = limits.call_timeout_s
    options["max_output_chars"] = limits.max_output_chars
  elif sandbox is not None and "call_timeout_s" in sandbox:
    options["call_timeout_s"] = float(sandbox.call_timeout_s)
  environments = getattr(config, "environments", None)
  if environments is not None and "require" in environments:
    options["require"] = tuple(environments.require)
    check_require(options["require"])
  if environments is not None and environments.get("reset_gate", False):
    options["reset_gate"] = True
  return options


def check_require(require) -> None:
  """Raises ValueError naming an unknown property in `require`."""
  unknown = [p for p in require if p not in contract.PROPERTIES]
  if unknown:
    raise ValueError(
        f"environments.require names unknown properties {unknown}; choose"
        f" from {list(contract.PROPERTIES)}"
    )


def validate_program(
    source: str,
    *,
    smoke_steps: int = contract.SMOKE_STEPS,
    max_output_chars: int | None = None,
    seed: int = 0,
    time_budget_s: float | None = None,
    call_timeout_s: float | None = None,
    budgets: str = budget.DEFAULT,
    require: tuple[str, ...] | list[str] = (),
    reset_gate: bool = False,
    filename: str = "<env>",
) -> dict[str, Any]:
  """Checks an environment program by running it in this process.

  Refuses what the reference's loader and `validate_game` refuse (syntax,
  module-level errors, no `*Env` class, init, reset and its shape, step on
  the reference's replies with rewards finite in [-10, 10], a second reset,
  close), plus hostile code (the static pass) and calls past their budget
  (`call_timeout_s`, `max_output_chars`). The stricter checks are recorded
  as `properties` (see `contract.PROPERTIES`): deterministic, seeded,
  robust, rewards_in_unit, has_hint, solution_replayed (a list solution
  replayed to a win, tool calls through `execute_tool` as in play); each
  property in `require` that is missing refuses the program with reason
  "requires_<property>". `reset_gate` adds the reference's reset gate
  (reason "criteria_throw_at_reset", see `_Run._check_reset_gate`).
  Untrusted programs must be validated inside the
  sandbox (`SandboxPool.validate`), never in the trainer.

  Args:
    source: the program's Python source.
    smoke_steps: replies fed per smoke episode (the reference's three, then
      more of `SMOKE_ACTIONS`).
    max_output_chars: most characters one call may return; None: the named
      budgets' (reference: a 32,768-token context's worth, strict: 65,536).
    seed: the seed of the validated episode (seed + 1 is reset too).
    time_budget_s: budget of the whole check; None: the named budgets'
      (reference: 60 s, `VALIDATE_GAME_TIMEOUT`; strict: 24 s). The
      reference's checks come first; time that runs out after them leaves
      the program valid with the unchecked properties False.
    call_timeout_s: budget of one call (`sandbox.call_timeout_s`); None:
      the named budgets' (reference: 30 s, `ENV_STEP_TIMEOUT`; strict:
      0.5 s). Both are enforced with SIGALRM on the main thread, and each
      call is also timed when it returns; the sandbox host enforces the hard
      deadline.
    budgets: a name of `budget.BUDGETS` (`sandbox.budgets`), the defaults
      of the three limits above.
    require: properties a valid program must have (`environments.require`).
    reset_gate: refuse a program one of whose `_message_criteria` raises on
      the reset state at every seed of `contract.RESET_GATE_SEEDS` (`environments.reset_gate`; the reference's
      SPADE_RESET_GATE=1, set by its tool-use recipe).
    filename: the program's name in messages and tracebacks.

  Returns:
    A JSON-able dict: valid, reason (from `contract.REASONS`), message,
    properties {name: bool}, notes {property: why it is false}, has_hint,
    hint, has_tools, solution_text, solution_replayed, solution_steps,
    solution_tool_calls, description, class_name, smoke_steps, warnings,
    printed_chars, elapsed_s.
  """
  if not isinstance(source, str):
    raise TypeError(f"source must be a str of Python, got {type(source)}")
  require = tuple(require)
  check_require(require)
  limits = budget.resolve(budgets)
  if time_budget_s is None:
    time_budget_s = budget.VALIDATOR_SHARE * limits.validate_timeout_s
  if call_timeout_s is None:
    call_timeout_s = limits.call_timeout_s
  if max_output_chars is None:
    max_output_chars = limits.max_output_chars
  clock = budget.Clock(time_budget_s, call_timeout_s)
  options = dict(
      smoke_steps=smoke_steps,
      max_output_chars=max_output_chars,
      seed=seed,
      reset_gate=bool(reset_gate),
  )
  run = _Run(source, filename, options, clock)
  sink = _CappedSink()
  clock.install()
  try:
    with contextlib.redirect_stdout(sink):
      run.run()
  except _Reject as f:
    run.result.update(valid=False, reason=f.reason, message=f.message)
  except budget.OutOfTime:
    run.result.update(
        valid=False,
        reason="timeout",
        message=(
            f"validation took longer than {time_budget_s:g} s before the"
            " reference's checks (load, init, reset, three steps, a second"
            " reset, close) had passed; look for unbounded loops"
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
    clock.uninstall()
  if run.result["valid"]:
    for prop in require:
      if not run.properties[prop]:
        run.result.update(
            valid=False,
            reason=f"requires_{prop}",
            message=(
                f"the config requires {prop} (environments.require): "
                + run.notes.get(prop, "not shown")
            ),
        )
        break
  if not run.result["valid"] and sink.size:
    printed = "".join(sink.kept)[:300]
    run.result["message"] += f" (the program printed: {printed!r})"
  # Verdicts go back into designer prompts: keep messages short.
  run.result["message"] = run.result["message"][:2000]
  run.result["printed_chars"] = sink.size
  run.result["elapsed_s"] = round(time.monotonic() - clock.start, 4)
  return run.result
