"""The sandbox's init: runs untrusted environment programs, one process each.

Standard library only: it runs inside gVisor (or bubblewrap) from a read-only
bind of the `spade` package, and is started as `python -S worker.py ...`.

Protocol with the host (JSON lines on the worker's original stdin/stdout; the
worker moves them to private descriptors and points fds 0-2 at /dev/null so
nothing else can write on the channel):

  host -> worker  {"id": n, "items": [{"op": ..., ...}, ...]}
  worker -> host  {"id": n, "results": [...]}        one line per request

Ops: `create` (source, kwargs; optional open = {seed, calls}: reset and call
those methods too, in the same round trip) -> {"ok", "env"[, "obs", "info",
"calls"]}; `reset` (env, seed); `step` (env, action); `call` (env, method,
args); `close` (env); `validate` (source, options) -> the validator's
verdict; `run_code` (source, timeout_s); `stats`.

Every program is a forked child under its own uid (never reused within this
worker), in its own session, with rlimits (address space, processes, file
size, open files, no core), all inherited descriptors closed but its own
pipe pair, stdout/stderr on /dev/null, and a private 0700 directory as
cwd/HOME/TMPDIR. The program is loaded once in its child and each episode
(`env` id) is one instance of its class there (see `_Program`), so a
program's episodes cost one process, and different programs never share
one. The items of one request on one program travel to its child as one
batch, run there in order; different programs, validations and program runs
proceed at once. Each program call has a budget (`--call-timeout-s`): a
call past it, or returning more than `--call-output-cap-bytes`, ends that
episode; a call that does not yield to the child's timer has its whole
process killed (its program's episodes end, no other's). Validations and
program runs get a fresh child each, killed at their deadline; the host
enforces a later deadline on the worker by replacing the sandbox. Worker <->
child messages are a 4-byte length and JSON.

Forking is the slow part of `create` under gVisor's ptrace platform (~80-120
ms, against a few ms to load a program), so with `--spare-envs=N` the worker
keeps N program children forked ahead, made exactly as `create` would make
them, forking one at a time only while no request is waiting; the first
episode of a program hands it to one of them.
"""

import argparse
import collections
import fcntl
import gc
import importlib
import json
import math
import mmap
import os
import random
import re
import resource
import select
import shutil
import signal
import struct
import sys
import time
import traceback

_LEN = struct.Struct(">I")
_HIGH_FD = 512


class _Dead(Exception):
  """A child that can no longer answer; carries the failure it reports."""

  def __init__(self, reason, message):
    super().__init__(message)
    self.reason = reason
    self.message = message


# ---------------------------------------------------------------- children --


def _isolate(opts, uid, home, keep):
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


def _text_size(obj, limit, depth=0):
  """A lower bound on the encoded size: the lengths of the strings inside.

  Stops counting once past `limit`; containers deeper than 8 levels count as
  nothing here (the exact check after encoding still applies).
  """
  if isinstance(obj, (str, bytes)):
    return len(obj)
  if depth > 8:
    return 0
  total = 0
  items = obj
  if isinstance(obj, dict):
    items = (x for kv in obj.items() for x in kv)
  elif not isinstance(obj, (list, tuple)):
    return 0
  for item in items:
    total += _text_size(item, limit, depth + 1)
    if total > limit:
      break
  return total


def _send(fd, obj, limit, seq=None):
  """Child side: one framed JSON message; an oversized one becomes an error.

  `seq` echoes the request's sequence number, so an answer can never be
  taken for the answer to another request.
  """
  try:
    if _text_size(obj, limit) > limit:
      # Encoding tens of MiB only to refuse them can outlast the deadline.
      data = b"x" * (limit + 1)
    else:
      data = json.dumps(obj, allow_nan=False).encode("utf-8", "surrogatepass")
  except (TypeError, ValueError) as e:
    obj = {
        "ok": False,
        "reason": "bad_result",
        "message": f"the result is not JSON-serialisable: {e}"[:2000],
    }
    data = json.dumps(obj).encode()
  if len(data) > limit:
    obj = {
        "ok": False,
        "reason": "result_too_large",
        "message": (
            f"the result has {len(data)} bytes, over the {limit}-byte cap;"
            " return shorter observations"
        ),
    }
    data = json.dumps(obj).encode()
  if seq is not None:
    # Appended last so the size check above counts only the program's data.
    data = data[:-1] + b', "seq": ' + str(int(seq)).encode() + b"}"
  view = memoryview(_LEN.pack(len(data)) + data)
  while view:
    n = os.write(fd, view)
    view = view[n:]


def _recv(fd):
  """Child side: one framed message (blocking); None at end of stream.

  The worker sends one message and waits for the answer, so one read almost
  always returns all of it: each system call costs a trip through gVisor.
  """
  data = os.read(fd, 1 << 16)
  if len(data) < _LEN.size:
    while data and len(data) < _LEN.size:
      more = os.read(fd, _LEN.size - len(data))
      if not more:
        return None
      data += more
    if not data:
      return None
  size = _LEN.unpack(data[: _LEN.size])[0]
  chunks = [data[_LEN.size :]]
  have = len(chunks[0])
  while have < size:
    chunk = os.read(fd, min(size - have, 1 << 20))
    if not chunk:
      return None
    chunks.append(chunk)
    have += len(chunk)
  return json.loads(b"".join(chunks))


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


_BEAT = struct.Struct("<IId")  # sequence, batch item index, budget (s)


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
    _BEAT.pack_into(self.beat_page, 0, self.beat_seq, index, budget)

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
      if _text_size(result, self.cap) <= self.cap:
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
      msg = _recv(self.rfd)
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
      view = memoryview(_LEN.pack(len(data)) + data)
      while view:
        n = os.write(self.wfd, view)
        view = view[n:]


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


# The names of the program runtime and validator modules (`--runtime`,
# `--validator`), imported in `main` before any fork.
_MODULES = {
    "runtime": "spade.environments.runtime",
    "validator": "spade.environments.validator",
}


def _module(kind):
  """The runtime or validator module the host named (already imported)."""
  return importlib.import_module(_MODULES[kind])


def _program_server(rfd, wfd, beat, opts):
  """Child entry point: serves one program's episodes until end of input."""
  _Program(rfd, wfd, beat, opts).serve()


def _validate_child(wfd, source, options, limit):
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
  _send(wfd, verdict, limit)
  os._exit(0)


def _run_code_child(source):
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


# ------------------------------------------------------------------ worker --

# A program call that ignores its timer (a loop in C) is killed this long
# after its budget.
_HARD_GRACE_S = 0.5
_BEAT_POLL_S = 0.05


class _Child:
  """Worker-side record of one forked child and its pipes."""

  def __init__(self, pid, uid, home, rfd, wfd, kind):
    self.pid = pid
    self.uid = uid
    self.home = home
    self.rfd = rfd  # worker reads results (or stdout for run_code)
    self.wfd = wfd  # worker writes requests; None for one-shot children
    self.kind = kind
    self.inbuf = bytearray()
    self.status = None  # wait status once reaped
    self.outbuf = None  # bytes still to write to the child
    self.errfd = None  # stderr of a program run
    self.errbuf = bytearray()
    self.seq = None  # sequence number of the last request (program children)
    self.dead = None  # (reason, message) once it cannot answer any more
    self.beat = None  # page shared with a program child (see _Program)
    self.source = None  # the program a program child serves
    self.source_sent = False
    self.instances = set()  # env ids of its live episodes
    self.ended = {}  # env id -> (reason, message), episodes ended by a kill


class Worker:
  """Serves host requests; owns every child process and its uid."""

  def __init__(self, opts, proto_in, proto_out):
    self.opts = opts
    self.proto_in = proto_in
    self.proto_out = proto_out
    self.next_uid = opts.base_uid
    self.next_env = 1
    self.envs = {}  # env id -> the program child holding that episode
    self.programs = {}  # source -> its live program child
    self.by_pid = {}  # pid -> _Child, for reaping
    self.created = 0
    self.preloaded = []
    # Program children forked ahead, between requests: forking costs
    # ~80-120 ms under gVisor's ptrace platform, loading a program a few.
    self.spares = collections.deque()
    self.spare_failed = False

  # --- processes ---

  def _new_uid(self):
    uid = self.next_uid
    self.next_uid += 1
    home = os.path.join(self.opts.workdir, f"e{uid}")
    os.mkdir(home, 0o700)
    if self.opts.isolate:
      os.chown(home, uid, uid)
    return uid, home

  def spawn(self, kind, target, *args):
    """Forks an isolated child running target(*fds, *args)."""
    uid, home = self._new_uid()
    to_child = os.pipe()
    from_child = os.pipe()
    extra = None
    beat = None
    if kind == "run":
      extra = os.pipe()  # stderr
    elif kind == "program":
      beat = mmap.mmap(-1, mmap.PAGESIZE)  # shared, survives the fork
      args = (beat,) + args
    pid = os.fork()
    if pid == 0:
      try:
        if kind == "run":
          fds = _isolate(self.opts, uid, home, [from_child[1], extra[1]])
          os.dup2(fds[0], 1)
          os.dup2(fds[1], 2)
          os.close(fds[0])
          os.close(fds[1])
          target(*args)
        else:
          keep = [to_child[0], from_child[1]]
          fds = _isolate(self.opts, uid, home, keep)
          target(*fds, *args)
      except BaseException:  # pylint: disable=broad-except
        pass
      os._exit(70)
    os.close(to_child[0])
    os.close(from_child[1])
    if kind == "run":
      os.close(extra[1])
      os.close(to_child[1])
      child = _Child(pid, uid, home, from_child[0], None, kind)
      child.errfd = extra[0]
      os.set_blocking(extra[0], False)
    else:
      child = _Child(pid, uid, home, from_child[0], to_child[1], kind)
    child.beat = beat
    os.set_blocking(child.rfd, False)
    self.by_pid[pid] = child
    self.created += 1
    return child

  def _take_spare(self):
    """A live pre-forked program child, or None."""
    self.reap()
    while self.spares:
      child = self.spares.popleft()
      if child.status is None and child.dead is None:
        return child
      self.release(child)
    return None

  def _fork_spare(self):
    """Forks one program child that waits for its program."""
    try:
      self.spares.append(self.spawn("program", _program_server, self.opts))
    except OSError:
      # Out of processes or memory: no more spares until the next request
      # has been answered; `create` forks on demand and reports its own
      # failure.
      self.spare_failed = True

  def _program_child(self, source):
    """The live child serving `source`, started (from a spare) if none."""
    child = self.programs.get(source)
    if child is not None and child.dead is None:
      return child
    child = self._take_spare() or self.spawn(
        "program", _program_server, self.opts
    )
    child.source = source
    self.programs[source] = child
    return child

  def _forget(self, env_id):
    """Drops an episode; a program child with none left is ended."""
    child = self.envs.pop(env_id, None)
    if child is None:
      return
    child.instances.discard(env_id)
    child.ended.pop(env_id, None)
    self._end_if_empty(child)

  def _end_if_empty(self, child):
    if child.instances:
      return
    if self.programs.get(child.source) is child:
      del self.programs[child.source]
    if child.rfd is not None:
      self.kill(child)

  def _uid_pids(self, uid):
    pids = []
    for name in os.listdir("/proc"):
      if name.isdigit():
        try:
          if os.stat(f"/proc/{name}").st_uid == uid:
            pids.append(int(name))
        except OSError:
          pass
    return pids

  def kill(self, child):
    """Kills every process of the child's uid and removes its directory."""
    try:
      os.killpg(child.pid, signal.SIGKILL)
    except OSError:
      pass
    try:
      os.kill(child.pid, signal.SIGKILL)
    except OSError:
      pass
    if self.opts.isolate:
      # A fork bomb races the sweep; NPROC bounds it, repeat until none left.
      for _ in range(50):
        pids = self._uid_pids(child.uid)
        if not pids:
          break
        for pid in pids:
          try:
            os.kill(pid, signal.SIGKILL)
          except OSError:
            pass
        self.reap()
    self.release(child)

  def release(self, child):
    """Closes a finished child's pipes and directory; reaps it."""
    for fd in (child.rfd, child.wfd, child.errfd):
      if fd is not None:
        try:
          os.close(fd)
        except OSError:
          pass
    child.rfd = child.wfd = child.errfd = None
    if child.beat is not None:
      child.beat.close()
      child.beat = None
    shutil.rmtree(child.home, ignore_errors=True)
    self.reap()

  def reap(self):
    """Collects every exited process (the worker is init for orphans)."""
    while True:
      try:
        pid, status = os.waitpid(-1, os.WNOHANG)
      except ChildProcessError:
        return
      if pid == 0:
        return
      child = self.by_pid.pop(pid, None)
      if child is not None:
        child.status = status

  def wait_status(self, child, timeout_s=1.0):
    """The child's wait status, waiting briefly for it to exit."""
    deadline = time.monotonic() + timeout_s
    while child.status is None and time.monotonic() < deadline:
      try:
        pid, status = os.waitpid(child.pid, os.WNOHANG)
      except ChildProcessError:
        break
      if pid:
        child.status = status
        self.by_pid.pop(pid, None)
        break
      time.sleep(0.002)
    return child.status

  def describe_exit(self, child):
    status = self.wait_status(child)
    if status is None:
      return "the environment process stopped answering"
    if os.WIFSIGNALED(status):
      sig = os.WTERMSIG(status)
      try:
        name = signal.Signals(sig).name
      except ValueError:
        name = str(sig)
      return f"the environment process was killed by {name}"
    return f"the environment process exited with code {os.WEXITSTATUS(status)}"

  # --- framed I/O with children ---

  def _write(self, child, obj):
    """Queues a framed message; what the pipe takes now is written now."""
    child.seq = (child.seq or 0) + 1
    obj["seq"] = child.seq
    data = json.dumps(obj).encode("utf-8", "surrogatepass")
    child.outbuf = memoryview(_LEN.pack(len(data)) + data)
    os.set_blocking(child.wfd, False)
    try:
      self._pump_out(child)
    except _Dead:
      pass  # the read side reports the death with its exit status

  def _pump_out(self, child):
    try:
      n = os.write(child.wfd, child.outbuf)
    except BlockingIOError:
      return
    except OSError as e:
      raise _Dead("crash", self.describe_exit(child)) from e
    child.outbuf = child.outbuf[n:]

  def _pump_in(self, child, limit):
    """Reads what is there; returns a decoded message when one is complete."""
    while True:
      try:
        chunk = os.read(child.rfd, 1 << 16)
      except BlockingIOError:
        break
      if not chunk:
        raise _Dead("crash", self.describe_exit(child))
      child.inbuf += chunk
      if len(child.inbuf) >= _LEN.size:
        size = _LEN.unpack(child.inbuf[: _LEN.size])[0]
        if size > limit:
          raise _Dead(
              "output_too_large",
              f"the environment sent {size} bytes, over the {limit}-byte cap",
          )
        if len(child.inbuf) >= _LEN.size + size:
          body = bytes(child.inbuf[_LEN.size : _LEN.size + size])
          del child.inbuf[: _LEN.size + size]
          if child.inbuf:
            # Only one answer per request: more bytes mean the program wrote
            # on its result pipe itself, so nothing from it can be trusted.
            raise _Dead(
                "protocol",
                "the environment wrote extra data on its result channel",
            )
          try:
            msg = json.loads(body)
          except ValueError as e:
            raise _Dead("bad_result", f"unreadable result: {e}") from e
          if not isinstance(msg, dict):
            raise _Dead("bad_result", "the result is not an object")
          if child.seq is not None and msg.pop("seq", None) != child.seq:
            raise _Dead(
                "protocol",
                "the environment answered out of turn (forged result)",
            )
          return msg
    return None

  # --- request execution ---

  def run_items(self, items):
    """Runs one request's items.

    The items on one program (creates of its source, calls on its episodes)
    go to its child as one batch, run there in order; different programs,
    validations and program runs run at once (up to `max_parallel`).
    """
    results = [None] * len(items)
    batches = {}  # program child -> [(item index, sub-item, env id)]
    pending = collections.deque()  # job starters
    for i, item in enumerate(items):
      op = item.get("op")
      if op == "stats":
        results[i] = self.stats()
      elif op == "create":
        try:
          child = self._program_child(item["source"])
        except OSError as e:
          results[i] = {
              "ok": False,
              "reason": "crash",
              "message": f"could not start a process for the program: {e}",
          }
          continue
        env_id = self.next_env
        self.next_env += 1
        self.envs[env_id] = child
        child.instances.add(env_id)
        sub = {"op": "create", "inst": env_id, "kwargs": item.get("kwargs")}
        if item.get("open") is not None:
          sub["open"] = item["open"]
        if not child.source_sent:
          sub["source"] = item["source"]
          child.source_sent = True
        batches.setdefault(child, []).append((i, sub, env_id))
      elif op in ("reset", "step", "call", "close"):
        env_id = item.get("env")
        child = self.envs.get(env_id)
        if child is None:
          results[i] = {
              "ok": False,
              "reason": "closed",
              "message": f"environment {env_id} does not exist or was closed",
          }
          continue
        gone = child.ended.get(env_id) or child.dead
        if gone is not None:
          if op == "close":
            self._forget(env_id)
            results[i] = {"ok": True}
          else:
            results[i] = {
                "ok": False,
                "reason": gone[0],
                "message": (
                    f"environment {env_id} is no longer running: {gone[1]}"
                ),
            }
          continue
        sub = {"op": op, "inst": env_id}
        if op == "reset":
          sub["seed"] = item.get("seed")
        elif op == "step":
          sub["action"] = item.get("action", "")
        elif op == "call":
          sub["method"] = item.get("method")
          sub["args"] = item.get("args") or []
        batches.setdefault(child, []).append((i, sub, env_id))
      else:
        pending.append(lambda i=i, item=item: self._start(i, item, results))
    for child, entries in batches.items():
      pending.appendleft(
          lambda c=child, e=entries: self._start_batch(c, e, results)
      )
    active = {}  # result fd -> job

    def start_next():
      while pending and len(active) < self.opts.max_parallel:
        job = pending.popleft()()
        if job is not None:
          active[job["fd"]] = job

    start_next()
    while active:
      now = time.monotonic()
      wake = min(self._deadline(j, now) for j in active.values())
      if any(j["kind"] == "program" for j in active.values()):
        # Look at the programs' heartbeats often enough to see each call
        # start close to when it did.
        wake = min(wake, now + _BEAT_POLL_S)
      poller = select.poll()
      for fd, job in active.items():
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        child = job["child"]
        if child.wfd is not None and child.outbuf:
          poller.register(child.wfd, select.POLLOUT | select.POLLERR)
        if child.errfd is not None:
          poller.register(child.errfd, select.POLLIN | select.POLLHUP)
      try:
        events = poller.poll(max(0.0, wake - now) * 1000.0)
      except InterruptedError:
        events = []
      ready = {fd for fd, _ in events}
      for fd, job in list(active.items()):
        child = job["child"]
        done = False
        try:
          if child.wfd is not None and child.wfd in ready and child.outbuf:
            self._pump_out(child)
          if job["kind"] == "run":
            done = self._pump_run(job)
          elif fd in ready:
            msg = self._pump_in(child, job["cap"])
            if msg is not None:
              done = True
              job["on_result"](msg)
          if not done:
            now = time.monotonic()
            if now >= self._deadline(job, now):
              raise _Dead(job["timeout_reason"], job["timeout_message"])
        except _Dead as dead:
          self.kill(child)
          child.dead = (dead.reason, dead.message)
          job["on_dead"](dead)
          done = True
        if done:
          del active[fd]
      start_next()
    self.reap()
    return results

  def _deadline(self, job, now):
    """When a job is overdue; a program's heartbeat moves it on."""
    if job["kind"] != "program":
      return job["deadline"]
    child = job["child"]
    if child.beat is not None:
      seq, index, budget = _BEAT.unpack_from(child.beat, 0)
      if seq != job["beat"][0]:
        if not (0.0 <= budget <= job["max_budget"]):
          budget = job["max_budget"]  # the program wrote on the page
        job["beat"] = (seq, index, budget, now)
    _, _, budget, seen = job["beat"]
    return min(job["deadline"], seen + budget + _HARD_GRACE_S)

  def _start_batch(self, child, entries, results):
    """Sends one program child its batch; returns the job awaiting it."""
    opts = self.opts
    budget = 0.0
    for _, sub, _ in entries:
      budget += opts.call_timeout_s
      if sub["op"] == "create":
        calls = (sub.get("open") or {}).get("calls") or []
        budget += opts.call_timeout_s * (1 + len(calls))
        budget += opts.step_timeout_s if "source" in sub else 0.0
    now = time.monotonic()
    first = opts.step_timeout_s + opts.call_timeout_s
    # Before sending: a quick child beats before the write returns.
    seq = _BEAT.unpack_from(child.beat, 0)[0]
    self._write(child, {"op": "batch", "items": [e[1] for e in entries]})

    def on_result(msg):
      out = msg.get("results")
      if not isinstance(out, list) or len(out) != len(entries):
        raise _Dead("bad_result", "the program's reply has the wrong shape")
      for (i, sub, env_id), r in zip(entries, out):
        if not isinstance(r, dict):
          r = {"ok": False, "reason": "bad_result", "message": "malformed"}
        if sub["op"] == "create":
          if r.get("ok"):
            r["env"] = env_id
          else:
            self._forget(env_id)
        elif sub["op"] == "close":
          self._forget(env_id)
        results[i] = r
      self._end_if_empty(child)

    def on_dead(dead):
      if self.programs.get(child.source) is child:
        del self.programs[child.source]
      hung = None
      if dead.reason == "call_timeout":
        index = job["beat"][1]
        if index < len(entries):
          hung = entries[index][2]
          child.ended[hung] = (dead.reason, dead.message)
          child.dead = (
              "call_timeout",
              "the program's process was killed: a call of its environment"
              f" {hung} ran past its limit without yielding",
          )
      for i, sub, env_id in entries:
        reason, message = child.ended.get(env_id) or child.dead
        if sub["op"] == "close":
          self._forget(env_id)
          results[i] = {"ok": True}
          continue
        results[i] = {"ok": False, "reason": reason, "message": message}
        if sub["op"] == "create":
          self._forget(env_id)

    job = {
        "fd": child.rfd,
        "child": child,
        "kind": "program",
        "cap": len(entries) * (opts.call_output_cap_bytes + 256) + 4096,
        "deadline": now + budget + opts.step_timeout_s + _HARD_GRACE_S,
        "max_budget": first,
        "beat": (seq, 0, first, now),
        "on_result": on_result,
        "on_dead": on_dead,
        "timeout_reason": "call_timeout",
        "timeout_message": (
            f"a call ran past its {opts.call_timeout_s} s limit and did not"
            " yield to its timer; the program's process was killed"
        ),
    }
    return job

  def _start(self, i, item, results):
    """Starts a validation or program run; None when already answered."""
    op = item.get("op")
    opts = self.opts

    def set_result(value):
      results[i] = value

    if op == "validate":
      deadline = time.monotonic() + float(
          item.get("timeout_s", opts.validate_timeout_s)
      )
      child = self.spawn(
          "validate",
          lambda rfd, wfd: _validate_child(
              wfd,
              item["source"],
              item.get("options") or {},
              opts.max_result_bytes,
          ),
      )

      def on_verdict(msg, child=child):
        self.kill(child)
        if not isinstance(msg, dict) or "valid" not in msg:
          msg = {"valid": False, "reason": "crash", "message": "no verdict"}
        results[i] = msg

      def on_verdict_dead(dead):
        reason = dead.reason if dead.reason in ("timeout", "crash") else "crash"
        results[i] = {"valid": False, "reason": reason, "message": dead.message}

      return self._job(
          child, deadline, on_verdict, on_verdict_dead, "validation"
      )
    if op == "run_code":
      timeout_s = float(item.get("timeout_s", opts.step_timeout_s))
      child = self.spawn("run", _run_code_child, item["source"])
      job = self._job(
          child, time.monotonic() + timeout_s, set_result, None, "program"
      )

      def on_run_dead(dead, child=child):
        results[i] = {
            "ok": False,
            "exit_code": None,
            "stdout": (
                bytes(child.inbuf[: opts.max_output_bytes]).decode(
                    "utf-8", "replace"
                )
            ),
            "stderr": (
                bytes(child.errbuf[: opts.max_output_bytes]).decode(
                    "utf-8", "replace"
                )
            ),
            "reason": dead.reason,
            "message": dead.message,
        }

      job["on_dead"] = on_run_dead
      job["results"] = results
      job["index"] = i
      return job
    results[i] = {
        "ok": False,
        "reason": "bad_op",
        "message": f"unknown op {op!r}",
    }
    return None

  def _job(self, child, deadline, on_result, on_dead, what):
    return {
        "fd": child.rfd,
        "child": child,
        "deadline": deadline,
        "on_result": on_result,
        "on_dead": on_dead,
        "kind": child.kind,
        "cap": self.opts.max_result_bytes,
        "timeout_reason": "timeout",
        "timeout_message": (
            f"the {what} did not finish within its deadline; its processes"
            " were killed"
        ),
    }

  def _pump_run(self, job):
    """Drains a program's stdout/stderr (capped); True once it has exited."""
    child = job["child"]
    cap = self.opts.max_output_bytes
    eof = 0
    for fd, buf in ((child.rfd, child.inbuf), (child.errfd, child.errbuf)):
      while True:
        try:
          chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
          break
        if not chunk:
          eof += 1
          break
        room = cap - len(buf)
        if room > 0:
          buf += chunk[:room]
    if eof < 2:
      return False
    status = self.wait_status(child, timeout_s=self.opts.step_timeout_s)
    stdout = bytes(child.inbuf).decode("utf-8", "replace")
    stderr = bytes(child.errbuf).decode("utf-8", "replace")
    self.kill(child)
    if status is None:
      code, reason = None, "crash"
    elif os.WIFSIGNALED(status):
      code, reason = -os.WTERMSIG(status), "crash"
    else:
      code = os.WEXITSTATUS(status)
      reason = "ok" if code == 0 else "exit"
    job["results"][job["index"]] = {
        "ok": code == 0,
        "exit_code": code,
        "stdout": stdout,
        "stderr": stderr,
        "reason": reason,
        "message": "" if code == 0 else f"the program ended with {code}",
    }
    return True

  def stats(self):
    """Counts of live environments, processes and created children."""
    procs = sum(1 for n in os.listdir("/proc") if n.isdigit())
    return {
        "ok": True,
        "envs": len(self.envs),
        "programs": len(self.programs),
        "processes": procs,
        "created": self.created,
        "spare_envs": len(self.spares),
        "preloaded": self.preloaded,
        "tmp_entries": len(os.listdir(self.opts.workdir)),
    }

  # --- main loop ---

  def _input_waiting(self, buf):
    if b"\n" in buf:
      return True
    readable, _, _ = select.select([self.proto_in], [], [], 0)
    return bool(readable)

  def serve(self):
    """Answers requests, one line each; forks spares while none waits."""
    buf = bytearray()
    while True:
      while (
          len(self.spares) < self.opts.spare_envs
          and not self.spare_failed
          and not self._input_waiting(buf)
      ):
        self._fork_spare()
      while b"\n" not in buf:
        data = os.read(self.proto_in, 1 << 16)
        if not data:
          return
        buf += data
      line, _, rest = bytes(buf).partition(b"\n")
      buf = bytearray(rest)
      try:
        request = json.loads(line)
        items = request["items"]
      except (ValueError, KeyError, TypeError) as e:
        self.reply({"id": None, "error": f"bad request: {e}"})
        continue
      results = self.run_items(items)
      self.spare_failed = False
      self.reply({"id": request.get("id"), "results": results})

  def reply(self, obj):
    data = json.dumps(obj).encode("utf-8", "surrogatepass") + b"\n"
    view = memoryview(data)
    while view:
      try:
        n = os.write(self.proto_out, view)
      except InterruptedError:
        continue
      view = view[n:]


def _parse(argv):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--isolate", action="store_true")
  p.add_argument("--sys-path", action="append", default=[])
  p.add_argument("--preload", action="append", default=[])
  # The program runtime and validator modules (see pool.RUNTIME_MODULE).
  p.add_argument("--runtime", default="spade.environments.runtime")
  p.add_argument("--validator", default="spade.environments.validator")
  p.add_argument("--workdir", default="/tmp")
  p.add_argument("--base-uid", type=int, default=10000)
  p.add_argument("--memory-mb", type=int, default=1024)
  p.add_argument("--nproc", type=int, default=32)
  p.add_argument("--nofile", type=int, default=64)
  p.add_argument("--fsize-mb", type=int, default=16)
  p.add_argument("--max-result-bytes", type=int, default=1 << 20)
  p.add_argument("--max-output-bytes", type=int, default=64 << 10)
  p.add_argument("--max-parallel", type=int, default=64)
  p.add_argument("--spare-envs", type=int, default=0)
  p.add_argument("--step-timeout-s", type=float, default=5.0)
  p.add_argument("--call-timeout-s", type=float, default=0.5)
  p.add_argument("--call-output-cap-bytes", type=int, default=256 << 10)
  p.add_argument("--timeout-strikes", type=int, default=2)
  p.add_argument("--validate-timeout-s", type=float, default=30.0)
  return p.parse_args(argv)


def main(argv=None):
  """Entry point: set up the channel, preload, announce, serve."""
  opts = _parse(sys.argv[1:] if argv is None else argv)
  proto_in = os.dup(0)
  proto_out = os.dup(1)
  devnull = os.open("/dev/null", os.O_RDWR)
  for fd in (0, 1, 2):
    os.dup2(devnull, fd)
  os.close(devnull)
  for path in reversed(opts.sys_path):
    sys.path.insert(0, path)
  # Children are reaped explicitly; a dead pipe must not kill the worker.
  signal.signal(signal.SIGPIPE, signal.SIG_IGN)
  if opts.isolate:
    # Nobody but the worker may create entries in shared writable places:
    # each environment writes only to its own 0700 directory.
    for path in (opts.workdir, "/dev/shm"):
      try:
        os.chmod(path, 0o711)
      except OSError:
        pass
  worker = Worker(opts, proto_in, proto_out)
  errors = {}
  _MODULES.update(runtime=opts.runtime, validator=opts.validator)
  for name in opts.preload + [opts.runtime, opts.validator]:
    try:
      __import__(name)
      worker.preloaded.append(name)
    except Exception as e:  # pylint: disable=broad-except
      errors[name] = f"{type(e).__name__}: {e}"
  if "numpy" in worker.preloaded:
    # numpy imports its random module on first use: once here, shared.
    try:
      __import__("numpy.random")
    except Exception as e:  # pylint: disable=broad-except
      errors["numpy.random"] = f"{type(e).__name__}: {e}"
  if "math_verify" in worker.preloaded:
    # Its first parse builds grammars and caches (~1 s): done here once, not
    # inside the first call of every program, against its 0.5 s budget.
    try:
      verifier = sys.modules["math_verify"]
      verifier.verify(verifier.parse("$\\frac{1}{2}$"), verifier.parse("0.5"))
    except Exception as e:  # pylint: disable=broad-except
      errors["math_verify warm-up"] = f"{type(e).__name__}: {e}"
  # Children share the preloaded heap copy-on-write; a collection in a
  # child would touch (and so copy) every page of it, so move it out of the
  # collector's reach.
  gc.collect()
  gc.freeze()
  worker.reply(
      {
          "hello": True,
          "pid": os.getpid(),
          "preloaded": worker.preloaded,
          "errors": errors,
      }
  )
  worker.serve()


if __name__ == "__main__":
  main()
