"""A pool of long-lived sandboxes that run untrusted environment programs.

Each sandbox is one gVisor container (`runsc run --detach`, no network,
read-only root, tmpfs `/tmp`) whose init is `spade/sandbox/worker.py`,
speaking JSON lines over the pipes of the `runsc` process. Every environment
program runs in a forked child of that worker under its own uid with
rlimits, and each of its episodes is an instance of its class in that child
(see worker.py and program_child.py), so one sandbox serves many episodes
at ~0.3 ms a step and an episode costs memory, not a process.

The host side (this module) routes calls to the sandbox that holds an
episode, keeps a program's episodes in one sandbox, batches the steps and
calls of many episodes into one request per sandbox (sandboxes work in
parallel), opens many episodes the same way (`open_many`: create, reset and
hint/tools calls in one round trip, in children the workers forked ahead),
enforces a deadline on top of the worker's per-call budgets (a sandbox that
misses it is destroyed and its episodes report `sandbox_lost`), recycles
sandboxes after N episodes, an age, or too many host tasks, swapping in a
warm spare started in the background, and on start removes what pools of
dead processes left behind (sweep.py).

Backends (backends.py): "gvisor" (default), "bwrap" (bubblewrap: namespaces
on the host kernel, announced as weaker), "none" (a plain subprocess for
trusted code only; never chosen implicitly). Options: `PoolOptions`
(options.py), kept whole as `SandboxPool.options`.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import shutil
import tempfile
import threading
import time
import weakref
from typing import Any

from spade.sandbox import backends
from spade.sandbox import runsc
from spade.sandbox import sweep
from spade.sandbox.errors import SandboxError
from spade.sandbox.options import PoolOptions

_log = logging.getLogger(__name__)

# Pools still open at interpreter exit are closed then, so that a program
# that forgot `close()` leaves no sandbox, runsc state or cgroup behind.
_OPEN_POOLS: "weakref.WeakSet[SandboxPool]" = weakref.WeakSet()


@atexit.register
def _close_open_pools() -> None:
  for pool in list(_OPEN_POOLS):
    try:
      pool.close()
    except Exception:  # pylint: disable=broad-except
      pass


class SandboxPool:
  """Runs environment programs in a few long-lived sandboxes.

  Use as a context manager, or call `close()`. Not thread-safe across public
  calls on purpose: one lock serialises them (the rollout batches).

  Attributes:
    options: the `PoolOptions` it runs with.
    swept: what the start-up sweep removed (`sweep.sweep_orphans`'s counts).
    tmpdir: its state directory, removed by `close()`.
    state_root: runsc's state directory in it.
    runsc: the runsc binary ("" for the other backends).
  """

  def __init__(
      self, backend: str = "gvisor", num_sandboxes: int = 2, **options
  ):
    """Starts `num_sandboxes` sandboxes (and a warm spare in the background).

    Args:
      backend: "gvisor" (default), "bwrap" (weaker: shares the host kernel) or
        "none" (no isolation; trusted code only).
      num_sandboxes: sandboxes serving environments at once.
      **options: the other fields of `PoolOptions` (timeouts, limits, caps,
        recycling), by name.

    Raises:
      SandboxError: "config" for a bad option, "not_installed" when the
        backend's program is missing, "start" when a sandbox did not start.
    """
    self.options = PoolOptions(
        backend=backend, num_sandboxes=num_sandboxes, **options
    )
    self.runsc = backends.check_installed(self.options)
    self.tmpdir = tempfile.mkdtemp(prefix=sweep.DIR_PREFIX)
    # First, so that a trainer killed from here on leaves a swept directory.
    sweep.write_owner(os.path.join(self.tmpdir, sweep.OWNER_FILE), os.getpid())
    self.swept = {"sandboxes": 0, "processes": 0, "directories": 0}
    if self.options.sweep:
      self.swept = sweep.sweep_orphans(runsc_path=self.runsc or None)
    self.state_root = os.path.join(self.tmpdir, "runsc-state")
    os.makedirs(self.state_root)
    self._launch = backends.Launch.make(
        self.options, self.tmpdir, self.state_root, self.runsc
    )
    self._lock = threading.RLock()
    self._spare_lock = threading.Lock()
    self._counter = itertools.count()
    self._handles: dict[int, tuple[backends.Sandbox, int]] = {}
    self._lost: dict[int, str] = {}  # handle -> why it is gone
    self._next_handle = itertools.count(1)
    self._sandboxes: list[backends.Sandbox] = []
    self._retired: list[backends.Sandbox] = []
    self._spare: backends.Sandbox | None = None
    self._spare_thread: threading.Thread | None = None
    self._reapers: list[threading.Thread] = []
    self._closed = False
    try:
      starters = [
          self._new_sandbox() for _ in range(self.options.num_sandboxes)
      ]
      self._start_all(starters)
      self._sandboxes = starters
      self._refill_spare()
    except BaseException:
      self.close()
      raise
    _OPEN_POOLS.add(self)

  # --- set-up ---

  def _new_sandbox(self) -> backends.Sandbox:
    return backends.Sandbox(self._launch, next(self._counter))

  def _start_all(self, sandboxes: list[backends.Sandbox]) -> None:
    """Starts sandboxes in parallel (each takes ~0.3-1 s, mostly waiting)."""
    errors = []

    def start(sb):
      try:
        sb.start()
      except BaseException as e:  # pylint: disable=broad-except
        errors.append(e)

    threads = [threading.Thread(target=start, args=(sb,)) for sb in sandboxes]
    for t in threads:
      t.start()
    for t in threads:
      t.join()
    if errors:
      for sb in sandboxes:
        sb.destroy()
      raise errors[0]

  def _refill_spare(self) -> None:
    if not self.options.warm_spare or self._closed:
      return
    if self._spare is not None or (
        self._spare_thread is not None and self._spare_thread.is_alive()
    ):
      return
    spare = self._new_sandbox()

    def start():
      try:
        spare.start()
      except BaseException as e:  # pylint: disable=broad-except
        _log.warning("could not start a spare sandbox: %s", e)
        return
      # Not self._lock: the caller may hold it while joining this thread.
      with self._spare_lock:
        closed = self._closed
        if not closed:
          self._spare = spare
      if closed:
        spare.destroy()

    self._spare_thread = threading.Thread(target=start, daemon=True)
    self._spare_thread.start()

  def _take_fresh(self) -> backends.Sandbox:
    """A started sandbox: the warm spare if ready, else a new one now."""
    if self._spare_thread is not None:
      self._spare_thread.join()
    with self._spare_lock:
      spare, self._spare = self._spare, None
    if spare is None:
      spare = self._new_sandbox()
      spare.start()
    self._refill_spare()
    return spare

  def _destroy_later(self, sb: backends.Sandbox) -> None:
    """`runsc delete` takes ~1.5 s: do it off the caller's path."""
    t = threading.Thread(target=sb.destroy, daemon=True)
    t.start()
    self._reapers.append(t)
    self._reapers = [r for r in self._reapers if r.is_alive()]

  def _replace(self, sb: backends.Sandbox, why: str) -> None:
    """Drops a sandbox (lost or worn out and empty) and puts a fresh one in."""
    for handle, (owner, _) in list(self._handles.items()):
      if owner is sb:
        del self._handles[handle]
        self._lost[handle] = why
    if sb in self._sandboxes:
      self._sandboxes.remove(sb)
    if sb in self._retired:
      self._retired.remove(sb)
    self._destroy_later(sb)
    if not self._closed and len(self._sandboxes) < self.options.num_sandboxes:
      self._sandboxes.append(self._take_fresh())

  def _retire_if_worn(self, sb: backends.Sandbox) -> None:
    if sb.retired or not sb.worn_out():
      return
    sb.retired = True
    self._sandboxes.remove(sb)
    self._retired.append(sb)
    self._sandboxes.append(self._take_fresh())
    if not sb.envs:
      self._replace(sb, "recycled")

  # --- requests ---

  def _request(
      self, per_sandbox: dict[backends.Sandbox, list[dict]], timeout_s: float
  ) -> dict[backends.Sandbox, list[dict] | str]:
    """Sends one request to each sandbox, then collects all answers.

    A sandbox that dies or misses `timeout_s + host_grace_s` is replaced and
    its entry is the reason string instead of results.
    """
    sent = {}
    out: dict[backends.Sandbox, Any] = {}
    for sb, items in per_sandbox.items():
      try:
        sent[sb] = sb.send(items)
      except backends.Lost as e:
        out[sb] = str(e)
    deadline = time.monotonic() + timeout_s + self.options.host_grace_s
    for sb, rid in sent.items():
      try:
        out[sb] = sb.receive(rid, deadline, len(per_sandbox[sb]))
      except backends.Lost as e:
        out[sb] = str(e)
    for sb, value in out.items():
      if isinstance(value, str):
        _log.warning("sandbox %s lost (%s); replacing it", sb.name, value)
        self._replace(sb, value)
    return out

  def _check_open(self) -> None:
    if self._closed:
      raise SandboxError("closed", "the pool is closed; make a new SandboxPool")

  def _owner(self, handle: int) -> tuple[backends.Sandbox, int]:
    if handle in self._handles:
      return self._handles[handle]
    if handle in self._lost:
      raise SandboxError(
          "sandbox_lost",
          f"environment {handle} was lost with its sandbox"
          f" ({self._lost[handle]}); create it again",
      )
    raise SandboxError("closed", f"no environment with handle {handle}")

  def _lost_result(self, handle: int) -> dict:
    try:
      self._owner(handle)
    except SandboxError as e:
      return {"ok": False, "reason": e.reason, "message": e.message}
    return {"ok": False, "reason": "sandbox_lost", "message": "sandbox lost"}

  def _pick(
      self, source: str, load: dict[backends.Sandbox, int] | None = None
  ) -> backends.Sandbox:
    """The sandbox for a new episode of `source`.

    The one already running that program (its episodes share one process
    there), else the one with the fewest live episodes.
    """
    for sb in self._sandboxes:
      if sb.sources.get(source):
        return sb
    return min(
        self._sandboxes,
        key=lambda s: (load[s] if load else len(s.envs), s.index),
    )

  @staticmethod
  def _add_env(sb: backends.Sandbox, env: int, source: str) -> None:
    sb.envs.add(env)
    sb.env_source[env] = source
    sb.sources[source] = sb.sources.get(source, 0) + 1

  @staticmethod
  def _drop_env(sb: backends.Sandbox, env: int) -> None:
    sb.envs.discard(env)
    source = sb.env_source.pop(env, None)
    if source is not None:
      sb.sources[source] -= 1
      if not sb.sources[source]:
        del sb.sources[source]

  def _one(self, sb: backends.Sandbox, item: dict, timeout_s: float) -> dict:
    value = self._request({sb: [item]}, timeout_s)[sb]
    if isinstance(value, str):
      return {
          "ok": False,
          "reason": "sandbox_lost",
          "message": f"the sandbox was replaced: {value}",
      }
    return (
        value[0]
        if isinstance(value[0], dict)
        else {
            "ok": False,
            "reason": "bad_result",
            "message": "malformed result",
        }
    )

  # --- public API ---

  def validate(self, sources: list[str], **options) -> list[dict]:
    """Validates programs in the sandboxes, in parallel; one verdict each.

    Runs `spade.environments.validator.validate_program(source, **options)`
    in a fresh child per program. A program that hangs, crashes or attacks
    the sandbox yields {"valid": False, "reason": "timeout"/"crash"/...,
    "message": ...}; it never raises and never stops the others.
    """
    with self._lock:
      self._check_open()
      options = dict(options)
      # The validator's own budget ends before the worker's hard deadline,
      # so a slow program gets a "timeout" verdict with its context; the
      # same per-call budget as in play makes a program that would stall a
      # rollout invalid.
      options.setdefault(
          "time_budget_s", max(1.0, 0.8 * self.options.validate_timeout_s)
      )
      options.setdefault("call_timeout_s", self.options.call_timeout_s)
      verdicts: list[dict | None] = [None] * len(sources)
      per: dict[backends.Sandbox, list[dict]] = {}
      where: dict[backends.Sandbox, list[int]] = {}
      for i, source in enumerate(sources):
        sb = self._sandboxes[i % len(self._sandboxes)]
        per.setdefault(sb, []).append(
            {
                "op": "validate",
                "source": source,
                "options": options,
                "timeout_s": self.options.validate_timeout_s,
            }
        )
        where.setdefault(sb, []).append(i)
      rounds = (
          -(-max(len(v) for v in per.values()) // self.options.max_parallel)
          if per
          else 0
      )
      answers = self._request(
          per, self.options.validate_timeout_s * max(rounds, 1)
      )
      for sb, value in answers.items():
        sb.children += len(where[sb])
        for k, i in enumerate(where[sb]):
          if isinstance(value, str):
            verdicts[i] = {
                "valid": False,
                "reason": "crash",
                "message": f"the sandbox was lost during validation: {value}",
            }
          else:
            verdicts[i] = (
                value[k]
                if isinstance(value[k], dict)
                else {"valid": False, "reason": "crash", "message": "malformed"}
            )
      for v in verdicts:
        for key, default in (
            ("has_hint", False),
            ("hint", None),
            ("solution_text", None),
            ("description", ""),
            ("class_name", ""),
            ("message", ""),
        ):
          v.setdefault(key, default)
      for sb in list(self._sandboxes):
        self._retire_if_worn(sb)
      return verdicts  # type: ignore[return-value]

  def create(self, source: str, kwargs: dict | None = None) -> int:
    """Loads a program in a new environment process; returns its handle.

    Raises:
      SandboxError: the program did not load (reason from the loader:
        "syntax", "load", "no_env_class", ...; or "exception", "timeout",
        "crash").
    """
    with self._lock:
      self._check_open()
      sb = self._pick(source)
      # A new process only for a program not running there yet.
      new = 0 if sb.sources.get(source) else 1
      result = self._one(
          sb,
          {"op": "create", "source": source, "kwargs": kwargs or {}},
          self.options.step_timeout_s,
      )
      if sb in self._sandboxes or sb in self._retired:
        sb.children += new
      if not result.get("ok"):
        if sb in self._sandboxes:
          self._retire_if_worn(sb)
        raise SandboxError(
            str(result.get("reason", "crash")),
            str(result.get("message", "the environment did not load")),
        )
      handle = next(self._next_handle)
      self._handles[handle] = (sb, result["env"])
      self._add_env(sb, result["env"], source)
      self._retire_if_worn(sb)
      return handle

  def open_many(self, items: list[dict]) -> list[dict]:
    """Creates and resets many environments at once: one request per sandbox.

    Each item is {"source", "seed", optional "kwargs", optional "calls": method
    names called right after the reset (e.g. ["hint", "get_tools"])}. The
    environments of one sandbox load concurrently (up to `max_parallel`) in
    pre-forked processes, each in a single round trip.

    Returns, in order, {"ok": True, "handle", "obs", "info", "calls": {name:
    {"ok", "value"} or {"ok": False, "reason", "message"}}} or {"ok": False,
    "reason", "message"} for a program that did not load or reset; one
    program's failure never affects another's episodes.
    """
    with self._lock:
      self._check_open()
      results: list[dict | None] = [None] * len(items)
      per: dict[backends.Sandbox, list[dict]] = {}
      where: dict[backends.Sandbox, list[int]] = {}
      load = {sb: len(sb.envs) for sb in self._sandboxes}
      home: dict[str, backends.Sandbox] = (
          {}
      )  # a program's episodes stay together
      for i, item in enumerate(items):
        sb = home.get(item["source"]) or self._pick(item["source"], load)
        home[item["source"]] = sb
        load[sb] += 1
        per.setdefault(sb, []).append(
            {
                "op": "create",
                "source": item["source"],
                "kwargs": item.get("kwargs") or {},
                "open": {
                    "seed": item.get("seed"),
                    "calls": list(item.get("calls") or []),
                },
            }
        )
        where.setdefault(sb, []).append(i)
      # Loading each program, then each episode's init, reset and calls.
      timeout = 0.0
      for sb_items in per.values():
        programs = len({it["source"] for it in sb_items})
        calls = max(len(it["open"]["calls"]) for it in sb_items)
        timeout = max(
            timeout,
            self.options.step_timeout_s
            * (1 + -(-programs // self.options.max_parallel))
            + len(sb_items) * (2 + calls) * self.options.call_timeout_s,
        )
      started = {
          sb: len(
              {it["source"] for it in v if not sb.sources.get(it["source"])}
          )
          for sb, v in per.items()
      }
      answers = self._request(per, timeout)
      for sb, value in answers.items():
        if sb in self._sandboxes or sb in self._retired:
          sb.children += started[sb]
        for k, i in enumerate(where[sb]):
          r = value if isinstance(value, str) else value[k]
          if isinstance(r, str):
            results[i] = {
                "ok": False,
                "reason": "sandbox_lost",
                "message": f"the sandbox was replaced: {r}",
            }
          elif not isinstance(r, dict) or not r.get("ok"):
            r = r if isinstance(r, dict) else {}
            results[i] = {
                "ok": False,
                "reason": str(r.get("reason", "crash")),
                "message": str(
                    r.get("message", "the environment did not load")
                ),
            }
          else:
            handle = next(self._next_handle)
            self._handles[handle] = (sb, r["env"])
            self._add_env(sb, r["env"], items[i]["source"])
            results[i] = {
                "ok": True,
                "handle": handle,
                "obs": str(r.get("obs", "")),
                "info": dict(r.get("info") or {}),
                "calls": dict(r.get("calls") or {}),
            }
      for sb in list(self._sandboxes):
        self._retire_if_worn(sb)
      return results  # type: ignore[return-value]

  def reset(self, handle: int, seed: int | None = None) -> tuple[str, dict]:
    """Resets an environment; returns (observation, info)."""
    with self._lock:
      self._check_open()
      sb, env = self._owner(handle)
      r = self._one(
          sb,
          {"op": "reset", "env": env, "seed": seed},
          self.options.step_timeout_s,
      )
      if not r.get("ok"):
        raise SandboxError(str(r.get("reason")), str(r.get("message")))
      return str(r.get("obs", "")), dict(r.get("info") or {})

  def step(self, handle: int, action: str) -> dict:
    """One step of one environment (see `step_many` for the result)."""
    return self.step_many([(handle, action)])[0]

  def step_many(self, actions: list[tuple[int, str]]) -> list[dict]:
    """Steps many environments at once: one request per sandbox.

    Returns, in order, {"ok": True, "obs", "reward", "terminated",
    "truncated", "info"} or {"ok": False, "reason", "message"}. A step past
    `call_timeout_s` or over the output cap ends its episode ("call_timeout",
    "output_too_large"); an exception fails that step only; a crash of a
    program's process ends that program's episodes; other programs'
    episodes are never affected.
    """
    return self._on_envs(
        actions,
        lambda env, action: {"op": "step", "env": env, "action": str(action)},
        _clean_step,
    )

  def call_many(self, items: list[tuple[int, str, list | tuple]]) -> list[dict]:
    """Calls public methods of many environments: one request per sandbox.

    Each item is (handle, method, args), e.g. (h, "execute_tool", [name,
    arguments]). Returns, in order, {"ok": True, "value"} or {"ok": False,
    "reason", "message"}; a failure of one call never affects the others.
    """
    return self._on_envs(
        items,
        lambda env, method, args: {
            "op": "call", "env": env, "method": method, "args": list(args),
        },
        _clean_call,
    )  # fmt: skip

  def _on_envs(self, items, request_of, clean) -> list[dict]:
    """Items `(handle, *rest)` on existing episodes, one request per sandbox.

    `request_of(env, *rest)` is an item's request to its worker and
    `clean(answer)` its result; a handle the pool does not know, or whose
    sandbox was replaced, gets a failure of its own. In the items' order.
    """
    with self._lock:
      self._check_open()
      results: list[dict | None] = [None] * len(items)
      per: dict[backends.Sandbox, list[dict]] = {}
      where: dict[backends.Sandbox, list[int]] = {}
      for i, (handle, *rest) in enumerate(items):
        if handle not in self._handles:
          results[i] = self._lost_result(handle)
          continue
        sb, env = self._handles[handle]
        per.setdefault(sb, []).append(request_of(env, *rest))
        where.setdefault(sb, []).append(i)
      for sb, value in self._request_calls(per).items():
        for k, i in enumerate(where[sb]):
          r = value if isinstance(value, str) else value[k]
          if isinstance(r, str):
            results[i] = {
                "ok": False,
                "reason": "sandbox_lost",
                "message": f"the sandbox was replaced: {r}",
            }
          else:
            results[i] = clean(r)
      return results  # type: ignore[return-value]

  def _request_calls(
      self, per: dict[backends.Sandbox, list[dict]]
  ) -> dict[backends.Sandbox, list[dict] | str]:
    """Sends batches of calls on existing episodes; collects the answers."""
    # The calls on one program run in order in its process, each within
    # call_timeout_s: a batch can take that long.
    depth = max((len(v) for v in per.values()), default=1)
    return self._request(
        per, self.options.step_timeout_s + depth * self.options.call_timeout_s
    )

  def call(self, handle: int, method: str, *args) -> Any:
    """Calls a public method of the environment (e.g. "hint", "solution")."""
    with self._lock:
      self._check_open()
      sb, env = self._owner(handle)
      r = self._one(
          sb,
          {"op": "call", "env": env, "method": method, "args": list(args)},
          self.options.step_timeout_s,
      )
      if not r.get("ok"):
        raise SandboxError(str(r.get("reason")), str(r.get("message")))
      return r.get("value")

  def close_env(self, handle: int) -> None:
    """Ends an environment: its processes are killed, its files removed."""
    with self._lock:
      if self._closed:
        return
      if handle in self._lost:
        del self._lost[handle]
        return
      if handle not in self._handles:
        return
      sb, env = self._handles.pop(handle)
      self._one(sb, {"op": "close", "env": env}, self.options.step_timeout_s)
      self._drop_env(sb, env)
      if sb.retired and not sb.envs and sb in self._retired:
        self._replace(sb, "recycled")

  def run_code(self, source: str, timeout_s: float = 10.0) -> dict:
    """Runs a Python program once (e.g. a completion plus its tests).

    Returns {"ok": exit code 0, "exit_code": int or None (timeout),
    "stdout", "stderr" (capped), "reason": "ok"/"exit"/"timeout"/"crash",
    "message"}.
    """
    with self._lock:
      self._check_open()
      sb = min(self._sandboxes, key=lambda s: (len(s.envs), s.index))
      r = self._one(
          sb,
          {"op": "run_code", "source": source, "timeout_s": timeout_s},
          timeout_s,
      )
      sb.children += 1
      r.setdefault("exit_code", None)
      r.setdefault("stdout", "")
      r.setdefault("stderr", "")
      r.setdefault("ok", False)
      r.setdefault("reason", "crash")
      self._retire_if_worn(sb)
      return r

  def stats(self) -> list[dict]:
    """Per sandbox: live envs, processes inside, children so far, host pid,
    host tasks and resident memory (bytes)."""
    with self._lock:
      self._check_open()
      out = []
      answers = self._request(
          {sb: [{"op": "stats"}] for sb in self._sandboxes},
          self.options.step_timeout_s,
      )
      for sb, value in answers.items():
        entry = dict(value[0]) if not isinstance(value, str) else {"ok": False}
        entry.update(
            name=sb.name,
            host_pid=sb.pid,
            host_tasks=runsc.host_tasks(sb.pid),
            rss_bytes=runsc.rss_bytes(sb.pid),
        )
        out.append(entry)
      return out

  def where(self, handle: int) -> dict:
    """The sandbox holding an environment: {"name", "host_pid"}."""
    with self._lock:
      sb, _ = self._owner(handle)
      return {"name": sb.name, "host_pid": sb.pid}

  @property
  def num_envs(self) -> int:
    """Live environments across the pool."""
    return len(self._handles)

  def close(self) -> None:
    """Stops every sandbox and removes all state; idempotent."""
    with self._lock, self._spare_lock:
      if self._closed:
        return
      self._closed = True
    if self._spare_thread is not None:
      self._spare_thread.join()
    everything = list(self._sandboxes) + list(self._retired)
    if self._spare is not None:
      everything.append(self._spare)
    self._sandboxes, self._retired, self._spare = [], [], None
    threads = [threading.Thread(target=sb.destroy) for sb in everything]
    for t in threads:
      t.start()
    for t in threads + self._reapers:
      t.join()
    self._handles.clear()
    if self.options.backend == "gvisor":
      # Anything a failed start or a race left registered with runsc.
      for cid in runsc.leftover_ids(self.state_root):
        runsc.destroy(self.runsc, self.state_root, cid, 0)
    shutil.rmtree(self.tmpdir, ignore_errors=True)

  def __enter__(self) -> "SandboxPool":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def __del__(self):
    if not getattr(self, "_closed", True):
      try:
        self.close()
      except Exception:  # pylint: disable=broad-except
        pass


def _clean_call(r: Any) -> dict:
  """Checks the shape of a method call's result coming out of the sandbox."""
  if not isinstance(r, dict) or not r.get("ok"):
    r = r if isinstance(r, dict) else {}
    return {
        "ok": False,
        "reason": str(r.get("reason", "bad_result")),
        "message": str(r.get("message", "malformed result")),
    }
  return {"ok": True, "value": r.get("value")}


def _clean_step(r: Any) -> dict:
  """Checks the shape of a step result coming out of the sandbox."""
  if not isinstance(r, dict):
    return {"ok": False, "reason": "bad_result", "message": "malformed result"}
  if not r.get("ok"):
    return {
        "ok": False,
        "reason": str(r.get("reason", "crash")),
        "message": str(r.get("message", "")),
    }
  try:
    return {
        "ok": True,
        "obs": str(r["obs"]),
        "reward": float(r["reward"]),
        "terminated": bool(r["terminated"]),
        "truncated": bool(r["truncated"]),
        "info": r.get("info") if isinstance(r.get("info"), dict) else {},
    }
  except (KeyError, TypeError, ValueError):
    return {"ok": False, "reason": "bad_result", "message": "malformed step"}
