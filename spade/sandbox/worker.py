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
"calls"]}; `reset` (env, seed);
`step` (env, action); `call` (env, method, args); `close` (env); `validate`
(source, options) -> the validator's verdict; `run_code` (source, timeout_s);
`stats`. Items of one request run concurrently, except that items on the same
environment run in order.

Every environment (and every validation or program run) is a forked child
under its own uid (never reused within this worker), in its own session, with
rlimits (address space, processes, file size, open files, no core), all
inherited descriptors closed but its own pipe pair, stdout/stderr on
/dev/null, and a private 0700 directory as cwd/HOME/TMPDIR. The worker enforces
each call's deadline by killing every process of the environment's uid, and
the host enforces a later deadline on the worker by replacing the sandbox.
Worker <-> child messages are a 4-byte length and JSON; results over
`--max-result-bytes` are refused.

Forking is the slow part of `create` under gVisor's ptrace platform (~80-120
ms, against a few ms to load a program), so with `--spare-envs=N` the worker
keeps N environment children forked ahead, made exactly as `create` would
make them, forking one at a time only while no request is waiting; `create`
hands its program to one of them.
"""

import argparse
import collections
import fcntl
import gc
import json
import math
import os
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


def _env_server(rfd, wfd, limit):
  """Child: loads one program and serves reset/step/call until close."""
  env = None
  while True:
    msg = _recv(rfd)
    if msg is None:
      os._exit(0)
    op = msg.get("op")
    seq = msg.get("seq")
    try:
      if op == "create":
        from spade.environments import runtime  # pylint: disable=g-import-not-at-top

        try:
          cls = runtime.load_program(
              msg["source"], msg.get("filename", "<env>")
          )
        except runtime.ProgramError as e:
          _send(
              wfd,
              {"ok": False, "reason": e.reason, "message": e.message},
              limit,
              seq,
          )
          continue
        env = cls(**(msg.get("kwargs") or {}))
        reply = {
            "ok": True,
            "class_name": cls.__name__,
            "description": (cls.__doc__ or "").strip()[:4000],
        }
        opening = msg.get("open")
        if opening is not None:
          # create + reset + calls in one round trip (`SandboxPool.open_many`).
          reply.update(_reset(env, opening.get("seed")))
          reply["calls"] = {}
          for name in opening.get("calls") or []:
            try:
              reply["calls"][name] = {"ok": True, "value": _call(env, name, [])}
            except Exception as e:  # pylint: disable=broad-except
              reply["calls"][name] = _error(e)
        _send(wfd, reply, limit, seq)
      elif env is None:
        _send(
            wfd,
            {"ok": False, "reason": "no_env", "message": "not created"},
            limit,
            seq,
        )
      elif op == "reset":
        _send(wfd, {"ok": True, **_reset(env, msg.get("seed"))}, limit, seq)
      elif op == "step":
        out = env.step(msg["action"])
        if not (isinstance(out, tuple) and len(out) == 5):
          raise TypeError(
              "step() must return (obs, reward, terminated, truncated, info),"
              f" got {type(out).__name__}"
          )
        obs, reward, term, trunc, info = out
        if not isinstance(obs, str):
          raise TypeError(
              f"step() observation must be str, got {type(obs).__name__}"
          )
        reward = float(reward)
        if not math.isfinite(reward):
          raise ValueError(f"step() reward {reward} is not finite")
        _send(
            wfd,
            {
                "ok": True,
                "obs": obs,
                "reward": reward,
                "terminated": bool(term),
                "truncated": bool(trunc),
                "info": _jsonable(info or {}),
            },
            limit,
            seq,
        )
      elif op == "call":
        value = _call(env, msg["method"], msg.get("args", []))
        _send(wfd, {"ok": True, "value": value}, limit, seq)
      elif op == "close":
        if hasattr(env, "close"):
          env.close()
        _send(wfd, {"ok": True}, limit, seq)
        os._exit(0)
      else:
        _send(
            wfd,
            {"ok": False, "reason": "bad_op", "message": str(op)},
            limit,
            seq,
        )
    except BaseException as e:  # pylint: disable=broad-except
      if isinstance(e, SystemExit):
        os._exit(e.code if isinstance(e.code, int) else 1)
      _send(wfd, _error(e), limit, seq)


def _validate_child(wfd, source, options, limit):
  """Child: runs the validator once and reports its verdict."""
  try:
    from spade.environments import validator  # pylint: disable=g-import-not-at-top

    verdict = validator.validate_program(source, **options)
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
    self.seq = None  # sequence number of the last request (env children)
    self.dead = None  # (reason, message) once it cannot answer any more


class Worker:
  """Serves host requests; owns every child process and its uid."""

  def __init__(self, opts, proto_in, proto_out):
    self.opts = opts
    self.proto_in = proto_in
    self.proto_out = proto_out
    self.next_uid = opts.base_uid
    self.next_env = 1
    self.envs = {}  # env id -> _Child
    self.by_pid = {}  # pid -> _Child, for reaping
    self.created = 0
    self.preloaded = []
    # Environment children forked ahead, between requests: forking costs
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
    if kind == "run":
      extra = os.pipe()  # stderr
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
    os.set_blocking(child.rfd, False)
    self.by_pid[pid] = child
    self.created += 1
    return child

  def _take_spare(self):
    """A live pre-forked environment child, or None."""
    self.reap()
    while self.spares:
      child = self.spares.popleft()
      if child.status is None and child.dead is None:
        return child
      self.release(child)
    return None

  def _fork_spare(self):
    """Forks one environment child that waits for its program."""
    try:
      self.spares.append(
          self.spawn("env", _env_server, self.opts.max_result_bytes)
      )
    except OSError:
      # Out of processes or memory: no more spares until the next request
      # has been answered; `create` forks on demand and reports its own
      # failure.
      self.spare_failed = True

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

  def _pump_in(self, child):
    """Reads what is there; returns a decoded message when one is complete."""
    limit = self.opts.max_result_bytes
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
              "result_too_large",
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
    """Runs one request's items; same-env items in order, others at once."""
    results = [None] * len(items)
    queues = {}
    for i, item in enumerate(items):
      if item.get("op") in ("reset", "step", "call", "close"):
        key = ("env", item.get("env"))
      else:
        key = ("new", i)
      queues.setdefault(key, collections.deque()).append(i)
    busy = set()
    active = {}  # result fd -> job

    def start_next():
      progress = True
      while progress and len(active) < self.opts.max_parallel:
        progress = False
        for key, queue in queues.items():
          if key in busy or not queue:
            continue
          if len(active) >= self.opts.max_parallel:
            break
          i = queue.popleft()
          progress = True
          job = self._start(i, items[i], results)
          if job is not None:
            job["key"] = key
            busy.add(key)
            active[job["fd"]] = job

    start_next()
    while active:
      now = time.monotonic()
      timeout = max(0.0, min(j["deadline"] for j in active.values()) - now)
      poller = select.poll()
      for fd, job in active.items():
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        child = job["child"]
        if child.wfd is not None and child.outbuf:
          poller.register(child.wfd, select.POLLOUT | select.POLLERR)
        if child.errfd is not None:
          poller.register(child.errfd, select.POLLIN | select.POLLHUP)
      try:
        events = poller.poll(timeout * 1000.0)
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
            msg = self._pump_in(child)
            if msg is not None:
              done = True
              job["on_result"](msg)
          if not done and time.monotonic() >= job["deadline"]:
            raise _Dead("timeout", job["timeout_message"])
        except _Dead as dead:
          self.kill(child)
          child.dead = (dead.reason, dead.message)
          job["on_dead"](dead)
          done = True
        if done:
          del active[fd]
          busy.discard(job["key"])
      start_next()
    self.reap()
    return results

  def _start(self, i, item, results):
    """Starts item i; returns an active job, or None when already answered."""
    op = item.get("op")
    opts = self.opts
    step_deadline = time.monotonic() + float(
        item.get("timeout_s", opts.step_timeout_s)
    )

    def set_result(value):
      results[i] = value

    if op == "stats":
      results[i] = self.stats()
      return None
    if op == "create":
      child = self._take_spare() or self.spawn(
          "env", _env_server, opts.max_result_bytes
      )
      env_id = self.next_env
      self.next_env += 1
      self.envs[env_id] = child

      def on_create(msg):
        if msg.get("ok"):
          msg["env"] = env_id
        else:
          self.envs.pop(env_id, None)
          self.kill(child)
        results[i] = msg

      def on_create_dead(dead):
        self.envs.pop(env_id, None)
        results[i] = {
            "ok": False,
            "reason": dead.reason,
            "message": dead.message,
        }

      request = {
          "op": "create",
          "source": item["source"],
          "kwargs": item.get("kwargs") or {},
      }
      if item.get("open") is not None:
        request["open"] = item["open"]
      self._write(child, request)
      return self._job(
          child, step_deadline, on_create, on_create_dead, "create"
      )
    if op in ("reset", "step", "call", "close"):
      env_id = item.get("env")
      child = self.envs.get(env_id)
      if child is None:
        results[i] = {
            "ok": False,
            "reason": "closed",
            "message": f"environment {env_id} does not exist or was closed",
        }
        return None
      if child.dead is not None:
        reason, message = child.dead
        results[i] = {
            "ok": False,
            "reason": reason,
            "message": f"environment {env_id} is no longer running: {message}",
        }
        if op == "close":
          self.envs.pop(env_id, None)
          results[i] = {"ok": True}
        return None
      msg = {"op": op}
      if op == "reset":
        msg["seed"] = item.get("seed")
      elif op == "step":
        msg["action"] = item.get("action", "")
      elif op == "call":
        msg["method"] = item.get("method")
        msg["args"] = item.get("args") or []
      self._write(child, msg)

      def on_msg(msg, env_id=env_id, child=child):
        if op == "close":
          self.envs.pop(env_id, None)
          self.kill(child)
        results[i] = msg

      def on_dead(dead, env_id=env_id):
        if op == "close":
          self.envs.pop(env_id, None)
          results[i] = {"ok": True}
          return
        results[i] = {
            "ok": False,
            "reason": dead.reason,
            "message": dead.message,
        }

      return self._job(child, step_deadline, on_msg, on_dead, op)
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
      job["kind"] = "run"
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
  for name in opts.preload:
    try:
      __import__(name)
      worker.preloaded.append(name)
    except Exception as e:  # pylint: disable=broad-except
      errors[name] = f"{type(e).__name__}: {e}"
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
