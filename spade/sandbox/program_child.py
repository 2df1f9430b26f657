"""What runs in the worker's forked children: programs, validations, runs.

Standard library only, like the worker that imports it (see worker.py).
Every child is set up by `isolate` right after the fork: its own uid (never
reused within a worker), its own session, rlimits (address space, processes,
file size, open files, no core), every inherited descriptor closed but its
own pipes, stdout/stderr on /dev/null, and a private 0700 directory as
cwd/HOME/TMPDIR. Then it runs one of:

  `program_server`  one program, loaded once, serving its episodes (`env`
                    ids, one instance of its class each) in batches until
                    its input ends (see `_Program`);
  `validate_child`  the validator once, reporting its verdict;
  `run_code_child`  a program as `__main__`, its output on the pipes.

Program children frame their messages with `wire` and beat on the page they
share with the worker before each call, so that the worker can kill a call
that ignores its timer.
"""

import fcntl
import importlib
import json
import math
import os
import random
import re
import resource
import signal
import sys
import time
import traceback

# Imported as a sibling inside the sandbox, where the worker runs as a file.
if __package__:
  from spade.sandbox import wire
else:
  import wire  # pylint: disable=import-error

_HIGH_FD = 512


def isolate(opts, uid, home, keep):
  """In a fresh child: drop to `uid`, limit it, close what it must not see."""
  os.setsid()
  for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, signal.SIG_DFL)
  devnull = os.open("/dev/null", os.O_RDWR)
  # Move the kept descriptors above anything in use, then lay them out at
  # 3, 4, ... and close every other inherited descriptor.
  moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, _HIGH_FD) for fd in keep]
  for fd in (0, 1, 2):
    os.dup2(devnull, fd)
  out = []
  for i, fd in enumerate(moved):
    os.dup2(fd, 3 + i, inheritable=False)
    out.append(3 + i)
  for name in os.listdir("/proc/self/fd"):
    fd = int(name)
    if fd >= 3 + len(moved):
      try:
        os.close(fd)
      except OSError:
        pass
  mb = 1 << 20
  limits = [
      (resource.RLIMIT_AS, opts.memory_mb * mb),
      (resource.RLIMIT_NPROC, opts.nproc),
      (resource.RLIMIT_FSIZE, opts.fsize_mb * mb),
      (resource.RLIMIT_NOFILE, opts.nofile),
      (resource.RLIMIT_CORE, 0),
  ]
  for kind, value in limits:
    try:
      resource.setrlimit(kind, (value, value))
    except (ValueError, OSError):
      # NPROC/NOFILE may not be raisable above the inherited hard limit.
      soft, hard = resource.getrlimit(kind)
      value = min(value, hard) if hard != resource.RLIM_INFINITY else value
      resource.setrlimit(kind, (value, value))
  os.chdir(home)
  if opts.isolate:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
  os.environ.clear()
  os.environ.update(
      {
          "HOME": home,
          "TMPDIR": home,
          "PATH": "/usr/bin:/bin",
          "LANG": "C.UTF-8",
      }
  )
  return out


def _error(e):
  """Turns an exception raised by program code into a result."""
  reason = "memory" if isinstance(e, MemoryError) else "exception"
  tb = traceback.format_exception(type(e), e, e.__traceback__)
  return {
      "ok": False,
      "reason": reason,
      "message": f"{type(e).__name__}: {e}"[:2000] + "\n" + "".join(tb)[-4000:],
  }


def _jsonable(x, depth=0):
  """Best-effort JSON form of an info dict (numpy scalars, tuples, sets)."""
  if depth > 20:
    return repr(x)[:200]
  if x is None or isinstance(x, (bool, int, str)):
    return x
  if isinstance(x, float):
    return x if math.isfinite(x) else repr(x)
  if isinstance(x, dict):
    return {str(k): _jsonable(v, depth + 1) for k, v in x.items()}
  if isinstance(x, (list, tuple, set, frozenset)):
    return [_jsonable(v, depth + 1) for v in x]
  if hasattr(x, "item") and hasattr(x, "dtype"):
    try:
      return _jsonable(x.item(), depth + 1)
    except Exception:  # pylint: disable=broad-except
      pass
  if hasattr(x, "tolist"):
    try:
      return _jsonable(x.tolist(), depth + 1)
    except Exception:  # pylint: disable=broad-except
      pass
  return repr(x)[:1000]


def _reset(env, seed):
  """env.reset(seed=seed), checked: {"obs", "info"}."""
  out = env.reset(seed=seed)
  if isinstance(out, str):  # a bare observation, as the reference accepts
    out = (out, {})
  if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], str)):
    raise TypeError(
        "reset() must return (observation: str, info: dict), got"
        f" {type(out).__name__}"
    )
  return {"obs": out[0], "info": _jsonable(out[1] or {})}


def _call(env, name, args):
  """A public method's value, JSON-safe."""
  if not isinstance(name, str) or name.startswith("_"):
    raise AttributeError(f"method {name!r} may not be called")
  return _jsonable(getattr(env, name)(*args))


def _step(env, action):
  """env.step(action), checked: the step result's fields."""
  out = env.step(action)
  if not (isinstance(out, tuple) and len(out) == 5):
    raise TypeError(
        "step() must return (obs, reward, terminated, truncated, info),"
        f" got {type(out).__name__}"
    )
  obs, reward, term, trunc, info = out
  if not isinstance(obs, str):
    raise TypeError(f"step() observation must be str, got {type(obs).__name__}")
  reward = float(reward)
  if not math.isfinite(reward):
    raise ValueError(f"step() reward {reward} is not finite")
  return {
      "obs": obs,
      "reward": reward,
      "terminated": bool(term),
      "truncated": bool(trunc),
      "info": _jsonable(info or {}),
  }


class _CallTimeout(BaseException):
  """Raised inside program code by the per-call timer (not an Exception, so
  a program's `except Exception` does not swallow it)."""


# The deadline of the program call running now (time.monotonic()), or None
# between calls. A CPU-time timer (ITIMER_PROF: ITIMER_REAL is the one
# `signal.alarm` and so math_verify's own timeouts use) ticks while the
# process computes; its handler raises only inside a call that is past its
# deadline, and again each tick for a program that catches the first one. A
# call that blocks without computing is left to the worker's kill.
_CALL_DEADLINE = [None]


def _on_tick(signum, frame):  # pylint: disable=unused-argument
  deadline = _CALL_DEADLINE[0]
  if deadline is not None and time.monotonic() > deadline:
    raise _CallTimeout()


def _uses_global_random(source):
  """Whether a program may use the `random` module's global generator.

  Judged by its text: a use of `random.<name>` (or an alias) other than the
  `Random` classes, or a `from random import` of anything else. Programs
  that only make their own `random.Random(seed)` need no swapping.
  """
  aliases = {"random"} | set(
      re.findall(r"import\s+random\s+as\s+(\w+)", source)
  )
  names = "|".join(re.escape(a) for a in sorted(aliases))
  if re.search(
      rf"(?<![\w.])({names})\s*\.\s*(?!(Random|SystemRandom)\b)\w", source
  ):
    return True
  for imported in re.findall(
      r"from\s+random\s+import\s+\(?([\w\s,*]+)", source
  ):
    words = set(re.findall(r"[\w*]+", imported)) - {"as"}
    if words - {"Random", "SystemRandom"}:
      return True
  return False


def _uses_numpy_random(source):
  """Whether a program may use numpy's global generator (by its text)."""
  aliases = {"np", "numpy"} | set(
      re.findall(r"import\s+numpy\s+as\s+(\w+)", source)
  )
  names = "|".join(re.escape(a) for a in sorted(aliases))
  return bool(
      re.search(rf"\b({names})\s*\.\s*random\b", source)
      or re.search(r"from\s+numpy(\.random)?\s+import", source)
  )


class _Program:
  """Child: one program, loaded once, one instance of its class per episode.

  Serves batches ({"items": [...]}) from the worker, one framed reply each.
  Every program call (the class's `__init__`, `reset`, `step`, a method)
  has its own budget; before each one the child writes (sequence, item,
  budget) to a page it shares with the worker, which kills the process when
  a call outlives its budget by a grace margin (a C-level loop ignores the
  timer). A call past its budget, or with an oversized result, ends that
  episode only; after `strikes` timeouts in one batch the batch's further
  calls fail at once (and end their episodes), so a program whose calls
  keep timing out costs a batch at most that many budgets.

  Episodes of one program share the process, so each instance gets its own
  state of the global `random` and `numpy.random` generators (swapped in
  around its calls): an episode that seeds the global generator sees the
  same numbers as when it ran alone. A swap costs 20-100 us (numpy's more),
  so it is done only for programs whose source uses the global generators
  (`_uses_global_random`, `_uses_numpy_random`).
  """

  def __init__(self, rfd, wfd, beat, opts):
    self.rfd = rfd
    self.wfd = wfd
    self.beat_page = beat
    self.beat_seq = 0
    self.call_s = opts.call_timeout_s
    self.load_s = opts.step_timeout_s
    self.cap = opts.call_output_cap_bytes
    self.strikes_allowed = opts.timeout_strikes
    self.cls = None
    self.load_error = None
    self.insts = {}  # instance id -> object
    self.rng = {}  # instance id -> saved generator states
    self.ended = {}  # instance id -> (reason, message)
    self.strikes = 0
    self.current = None  # whose generator states are live now
    self.swap_random = False
    self.swap_numpy = False
    # The generators' states right after loading: what each episode saw
    # when it had a process of its own.
    self.pristine = None
    self.tick = max(0.005, min(0.05, self.call_s / 5))

  # --- generator states ---

  def _rng_state(self):
    # Not `numpy.random` unless needed: touching it imports it (~0.1 s).
    np_random = sys.modules["numpy"].random if self.swap_numpy else None
    return (
        random.getstate() if self.swap_random else None,
        np_random.get_state() if np_random is not None else None,
    )

  def _switch_to(self, inst):
    if self.current == inst:
      return
    if self.current in self.rng:
      self.rng[self.current] = self._rng_state()
    state = self.rng.get(inst)
    if state is not None:
      if state[0] is not None:
        random.setstate(state[0])
      if state[1] is not None:
        sys.modules["numpy"].random.set_state(state[1])
    self.current = inst

  # --- calls ---

  def _beat(self, index, budget):
    self.beat_seq = (self.beat_seq + 1) & 0xFFFFFFFF
    wire.BEAT.pack_into(self.beat_page, 0, self.beat_seq, index, budget)

  def _end(self, inst, reason, message):
    """Ends an episode: its instance is dropped, its later calls refused."""
    self.insts.pop(inst, None)
    self.rng.pop(inst, None)
    if self.current == inst:
      self.current = None
    self.ended[inst] = (reason, message)

  def _run(self, index, inst, fn, budget=None):
    """fn() under the budget; (True, value) or (False, error result)."""
    budget = self.call_s if budget is None else budget
    if self.strikes >= self.strikes_allowed:
      return False, {
          "ok": False,
          "reason": "call_timeout",
          "message": (
              f"{self.strikes} calls of this program ran past their"
              f" {self.call_s} s limit in this batch; its other calls in it"
              " are refused"
          ),
          "end": True,
      }
    self._beat(index, budget)
    if inst is not None:
      self._switch_to(inst)
    start = time.monotonic()
    error = None
    try:
      try:
        _CALL_DEADLINE[0] = start + budget
        value = fn()
      finally:
        _CALL_DEADLINE[0] = None
    except _CallTimeout:
      error = "timeout"
    except (SystemExit, KeyboardInterrupt) as e:
      return False, {
          "ok": False,
          "reason": "crash",
          "message": f"the program raised {type(e).__name__}: {e}"[:2000],
          "end": True,
      }
    except BaseException as e:  # pylint: disable=broad-except
      return False, _error(e)
    elapsed = time.monotonic() - start
    if error is not None or elapsed > budget:
      self.strikes += 1
      return False, {
          "ok": False,
          "reason": "call_timeout",
          "message": (
              f"the call ran {elapsed:.2f} s, past its {budget} s limit;"
              " keep each reset/step well under it"
          ),
          "end": True,
      }
    return True, value

  def _load(self, index, source):
    """Loads the program once; later creates reuse its class or its error."""
    runtime = _module("runtime")

    def load():
      try:
        return runtime.load_program(source), None
      except runtime.ProgramError as e:
        return None, {"ok": False, "reason": e.reason, "message": e.message}

    ok, value = self._run(index, None, load, self.load_s)
    if ok and value[1] is None:
      self.cls = value[0]
      self.swap_random = _uses_global_random(source)
      self.swap_numpy = "numpy" in sys.modules and _uses_numpy_random(source)
      self.pristine = self._rng_state()
    else:
      self.load_error = value[1] if ok else dict(value)
      self.load_error.pop("end", None)

  def _create(self, index, item):
    inst = item["inst"]
    if self.cls is None and self.load_error is None:
      if item.get("source") is None:
        self.load_error = {
            "ok": False,
            "reason": "protocol",
            "message": "the program's source never arrived",
        }
      else:
        self._load(index, item["source"])
    if self.load_error is not None:
      return dict(self.load_error)
    cls = self.cls
    self.rng[inst] = self.pristine
    kwargs = item.get("kwargs") or {}
    runtime = _module("runtime")

    # The reference's rule: cls(), then cls(max_turns=...) on a TypeError.
    ok, value = self._run(index, inst, lambda: runtime.instantiate(cls, kwargs))
    if not ok:
      self._drop(inst)
      return value
    self.insts[inst] = value
    reply = {
        "ok": True,
        "class_name": cls.__name__,
        "description": (cls.__doc__ or "").strip()[:4000],
    }
    opening = item.get("open")
    if opening is not None:
      # create + reset + calls in one round trip (`SandboxPool.open_many`).
      env = value
      ok, out = self._run(index, inst, lambda: _reset(env, opening.get("seed")))
      if not ok:
        self._drop(inst)
        return out
      reply.update(out)
      reply["calls"] = {}
      for name in opening.get("calls") or []:
        ok, out = self._run(index, inst, lambda n=name: _call(env, n, []))
        if ok:
          reply["calls"][name] = {"ok": True, "value": out}
        elif out.get("end"):
          self._drop(inst)
          out.pop("end", None)
          return out
        else:
          reply["calls"][name] = out
    return reply

  def _drop(self, inst):
    """Forgets an instance that was never handed out."""
    self.insts.pop(inst, None)
    self.rng.pop(inst, None)
    self.ended.pop(inst, None)
    if self.current == inst:
      self.current = None

  def _item(self, index, item):
    """One item's result (a dict, not yet encoded)."""
    op = item.get("op")
    inst = item.get("inst")
    if op == "create":
      return self._create(index, item)
    if op == "close":
      env = self.insts.get(inst)
      if env is not None and hasattr(env, "close"):
        self._run(index, inst, env.close)
      self._drop(inst)
      return {"ok": True}
    if inst in self.ended:
      reason, message = self.ended[inst]
      return {
          "ok": False,
          "reason": reason,
          "message": f"this episode ended earlier: {message}",
      }
    env = self.insts.get(inst)
    if env is None:
      return {"ok": False, "reason": "closed", "message": "no such episode"}
    if op == "reset":
      seed = item.get("seed")
      ok, out = self._run(index, inst, lambda: _reset(env, seed))
      return {"ok": True, **out} if ok else out
    if op == "step":
      action = item.get("action", "")
      ok, out = self._run(index, inst, lambda: _step(env, action))
      return {"ok": True, **out} if ok else out
    if op == "call":
      method, args = item.get("method"), item.get("args") or []
      ok, out = self._run(index, inst, lambda: _call(env, method, args))
      return {"ok": True, "value": out} if ok else out
    return {"ok": False, "reason": "bad_op", "message": str(op)}

  def _encode(self, item, result):
    """The item's result as JSON, within the per-call output cap."""
    inst = item.get("inst")
    ends = bool(result.pop("end", False))
    data = None
    try:
      if wire.text_size(result, self.cap) <= self.cap:
        data = json.dumps(result, allow_nan=False)
    except (TypeError, ValueError) as e:
      data = json.dumps(
          {
              "ok": False,
              "reason": "bad_result",
              "message": f"the result is not JSON-serialisable: {e}"[:2000],
          }
      )
    if data is None or len(data) > self.cap:
      size = "far" if data is None else f"{len(data)} bytes,"
      result = {
          "ok": False,
          "reason": "output_too_large",
          "message": (
              f"the result is {size} over the {self.cap}-byte cap of one"
              " call; return shorter observations"
          ),
      }
      ends = True
      data = json.dumps(result)
    if ends and inst is not None and item.get("op") != "close":
      if item.get("op") == "create":
        self._drop(inst)
      else:
        self._end(inst, result["reason"], result["message"])
    return data

  def serve(self):
    signal.signal(signal.SIGPROF, _on_tick)
    # Armed once: an idle process uses no CPU time, so it gets no ticks.
    signal.setitimer(signal.ITIMER_PROF, self.tick, self.tick)
    while True:
      msg = wire.recv(self.rfd)
      if msg is None:
        os._exit(0)
      items = msg.get("items") or []
      self.strikes = 0
      parts = []
      for index, item in enumerate(items):
        try:
          result = self._item(index, item)
        except _CallTimeout:
          # A tick that landed between a call's end and the deadline reset.
          result = {"ok": False, "reason": "call_timeout", "message": "late"}
        parts.append(self._encode(item, result))
      self._beat(len(items), self.load_s)
      data = (
          '{"results": ['
          + ",".join(parts)
          + '], "seq": %d}' % msg.get("seq", 0)
      ).encode("utf-8", "surrogatepass")
      wire.write_all(self.wfd, data)


# The names of the program runtime and validator modules (`--runtime`,
# `--validator`), imported in `main` before any fork.
MODULES = {
    "runtime": "spade.environments.runtime",
    "validator": "spade.environments.validator",
}


def _module(kind):
  """The runtime or validator module the host named (already imported)."""
  return importlib.import_module(MODULES[kind])


def program_server(rfd, wfd, beat, opts):
  """Child entry point: serves one program's episodes until end of input."""
  _Program(rfd, wfd, beat, opts).serve()


def validate_child(wfd, source, options, limit):
  """Child: runs the validator once and reports its verdict."""
  try:
    verdict = _module("validator").validate_program(source, **options)
  except BaseException as e:  # pylint: disable=broad-except
    if isinstance(e, SystemExit):
      os._exit(e.code if isinstance(e.code, int) else 1)
    verdict = {
        "valid": False,
        "reason": "crash",
        "message": _error(e)["message"],
    }
  wire.send(wfd, verdict, limit)
  os._exit(0)


def run_code_child(source):
  """Child: runs a program as `__main__`; exit code like `python prog.py`."""
  import builtins  # pylint: disable=g-import-not-at-top

  code = 0
  try:
    compiled = compile(source, "<program>", "exec")
    exec(compiled, {"__name__": "__main__", "__builtins__": builtins})  # pylint: disable=exec-used
  except SystemExit as e:
    if e.code is None:
      code = 0
    elif isinstance(e.code, int):
      code = e.code
    else:
      sys.stderr.write(str(e.code) + "\n")
      code = 1
  except BaseException:  # pylint: disable=broad-except
    traceback.print_exc()
    code = 1
  try:
    sys.stdout.flush()
    sys.stderr.flush()
  except BaseException:  # pylint: disable=broad-except
    pass
  os._exit(code & 0xFF)
