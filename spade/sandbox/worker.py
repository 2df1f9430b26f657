"""The sandbox's init: runs untrusted environment programs, one process each.

Standard library only: it runs inside gVisor (or bubblewrap) from a read-only
bind of the `spade` package, and is started as `python -S worker.py ...`;
its sibling modules wire.py and program_child.py come with that bind.

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

Every program is a forked child under its own uid, isolated and limited
(see program_child.py). The program is loaded once in its child and each
episode (`env` id) is one instance of its class there, so a program's
episodes cost one process, and different programs never share one. The
items of one request on one program travel to its child as one batch, run
there in order; different programs, validations and program runs proceed at
once. Each program call has a budget (`--call-timeout-s`): a call past it,
or returning more than `--call-output-cap-bytes`, ends that episode; a call
that does not yield to the child's timer has its whole process killed (its
program's episodes end, no other's). Validations and program runs get a
fresh child each, killed at their deadline; the host enforces a later
deadline on the worker by replacing the sandbox. Worker <-> child messages
are framed by wire.py.

This file is the supervisor: it forks the children, routes the items of a
request to them, watches their deadlines and heartbeats, and kills them.

Forking is the slow part of `create` under gVisor's ptrace platform (~80-120
ms, against a few ms to load a program), so with `--spare-envs=N` the worker
keeps N program children forked ahead, made exactly as `create` would make
them, forking one at a time only while no request is waiting; the first
episode of a program hands it to one of them.
"""

import argparse
import collections
import gc
import json
import mmap
import os
import select
import shutil
import signal
import sys
import time

# The worker runs as a file (`python -S .../spade/sandbox/worker.py`), so its
# folder is sys.path[0] and its sibling modules are imported from there by
# their own names: the host-side package `spade.sandbox` (whose __init__
# imports the pool) is never loaded in the sandbox.
if __package__:
  from spade.sandbox import program_child
  from spade.sandbox import wire
else:
  import program_child  # pylint: disable=import-error
  import wire  # pylint: disable=import-error


class _Dead(Exception):
  """A child that can no longer answer; carries the failure it reports."""

  def __init__(self, reason, message):
    super().__init__(message)
    self.reason = reason
    self.message = message


# A program call that ignores its timer (a loop in C) is killed this long
# after its budget.
_HARD_GRACE_S = 0.5
_BEAT_POLL_S = 0.05
# How long `kill` waits for a killed uid's processes to be gone. SIGKILL is
# delivered asynchronously (more so under gVisor on a busy host), so one
# sweep can find them still alive; a count of sweeps without a wait was not
# enough on a loaded machine.
_KILL_WAIT_S = 5.0


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
    self.beat = (
        None  # page shared with a program child (see program_child._Program)
    )
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
          fds = program_child.isolate(
              self.opts, uid, home, [from_child[1], extra[1]]
          )
          os.dup2(fds[0], 1)
          os.dup2(fds[1], 2)
          os.close(fds[0])
          os.close(fds[1])
          target(*args)
        else:
          keep = [to_child[0], from_child[1]]
          fds = program_child.isolate(self.opts, uid, home, keep)
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
      self.spares.append(
          self.spawn("program", program_child.program_server, self.opts)
      )
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
        "program", program_child.program_server, self.opts
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
      # A fork bomb races the sweep (NPROC bounds it) and a killed process
      # lingers until the signal lands: sweep until none is left.
      deadline = time.monotonic() + _KILL_WAIT_S
      while True:
        pids = self._uid_pids(child.uid)
        if not pids:
          break
        for pid in pids:
          try:
            os.kill(pid, signal.SIGKILL)
          except OSError:
            pass
        self.reap()
        if time.monotonic() > deadline:
          break
        time.sleep(0.001)
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
    child.outbuf = memoryview(wire.frame(data))
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
      if len(child.inbuf) >= wire.LEN.size:
        size = wire.LEN.unpack(child.inbuf[: wire.LEN.size])[0]
        if size > limit:
          raise _Dead(
              "output_too_large",
              f"the environment sent {size} bytes, over the {limit}-byte cap",
          )
        if len(child.inbuf) >= wire.LEN.size + size:
          body = bytes(child.inbuf[wire.LEN.size : wire.LEN.size + size])
          del child.inbuf[: wire.LEN.size + size]
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
      seq, index, budget = wire.BEAT.unpack_from(child.beat, 0)
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
    seq = wire.BEAT.unpack_from(child.beat, 0)[0]
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
          lambda rfd, wfd: program_child.validate_child(
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
      child = self.spawn("run", program_child.run_code_child, item["source"])
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
  # The program runtime and validator modules (see backends.RUNTIME_MODULE).
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
  program_child.MODULES.update(runtime=opts.runtime, validator=opts.validator)
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
