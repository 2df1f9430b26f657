"""A pool of long-lived sandboxes that run untrusted environment programs.

Each sandbox is one gVisor container (`runsc run --detach`, no network,
read-only root, tmpfs `/tmp`) whose init is `spade/sandbox/worker.py`,
speaking JSON lines over the pipes of the `runsc` process. Every environment
program runs in a forked child of that worker under its own uid with
rlimits, and each of its episodes is an instance of its class in that child
(see worker.py), so one sandbox serves many episodes at ~0.3 ms a step and
an episode costs memory, not a process.

The host side (this module) routes calls to the sandbox that holds an
episode, keeps a program's episodes in one sandbox, batches the steps and
calls of many episodes into one request per sandbox (sandboxes work in
parallel), opens many episodes the same way (`open_many`: create, reset and
hint/tools calls in one round trip, in children the workers forked ahead),
enforces a deadline on top of the worker's per-call budgets (a sandbox that
misses it is destroyed and its episodes report `sandbox_lost`), recycles
sandboxes after N episodes, an age, or too many host tasks, swapping in a
warm spare started in the background, and on start removes what pools of
dead processes left behind (`sweep_orphans`).

Backends: "gvisor" (default), "bwrap" (bubblewrap: namespaces on the host
kernel, announced as weaker), "none" (a plain subprocess for trusted code
only; never chosen implicitly).
"""

from __future__ import annotations

import atexit
import glob
import importlib.util
import itertools
import json
import logging
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from typing import Any

from spade.sandbox import runsc

BACKENDS = ("gvisor", "bwrap", "none")

# A pool's state directory (under the temporary directory) and the file in
# it naming its owner process; see `sweep_orphans`.
_DIR_PREFIX = "spade-sandbox-"
_OWNER_FILE = "owner.json"
_HOST_FILE = "host.json"  # in each sandbox's directory: its host process

_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")
_SPADE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The program runtime the worker serves, named rather than imported: a module
# with load_program(source), instantiate(cls, kwargs) and ProgramError, and a
# validator module with validate_program(source, **options) (spade.environments'
# own). The worker imports both by name before forking (a fork inherits
# them), so this package never imports the environment package that uses it.
RUNTIME_MODULE = "spade.environments.runtime"
VALIDATOR_MODULE = "spade.environments.validator"

_log = logging.getLogger(__name__)

# One BLAS thread: environments are single-threaded, and every thread pool
# numpy starts in the worker would be copied into each forked environment.
_SANDBOX_ENV = [
    "PATH=/usr/bin:/bin",
    "LANG=C.UTF-8",
    "OPENBLAS_NUM_THREADS=1",
    "OMP_NUM_THREADS=1",
    "MKL_NUM_THREADS=1",
]

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


class SandboxError(Exception):
  """A sandbox operation that failed.

  Attributes:
    reason: a short code ("not_installed", "start", "timeout", "crash",
      "call_timeout", "output_too_large", "closed", "sandbox_lost",
      "exception", a validator/loader reason, ...).
    message: what happened and what to do.
  """

  def __init__(self, reason: str, message: str):
    super().__init__(f"{reason}: {message}")
    self.reason = reason
    self.message = message


class _Lost(Exception):
  """A sandbox's worker that died or missed the host deadline."""


def _module_root(name: str) -> str | None:
  """The sys.path entry a module is imported from on the host, or None."""
  try:
    spec = importlib.util.find_spec(name)
  except (ImportError, ValueError):
    return None
  if spec is None or not spec.origin or not os.path.isabs(spec.origin):
    return None
  path = os.path.dirname(spec.origin)
  levels = len(name.split("."))
  if spec.submodule_search_locations is None:
    levels -= 1
  for _ in range(levels):
    path = os.path.dirname(path)
  return path


class _Sandbox:
  """Host side of one sandbox: its worker's pipes and bookkeeping."""

  def __init__(self, pool: "SandboxPool", index: int):
    self.pool = pool
    self.index = index
    # runsc names its control socket after the id (an abstract socket, global
    # to the host): unique per pool, not just per process.
    token = os.path.basename(pool.tmpdir).rsplit("-", 1)[-1]
    self.name = f"spade-{os.getpid()}-{token}-{index}"
    self.dir = os.path.join(pool.tmpdir, f"sb{index}")
    self.proc: subprocess.Popen | None = None
    self.pid = 0  # host pid of the sandbox (runsc-sandbox, bwrap or python)
    self.rfd = -1
    self.wfd = -1
    self.buf = bytearray()
    self.envs: set[int] = set()  # worker env ids living here
    self.env_source: dict[int, str] = {}  # worker env id -> its program
    self.sources: dict[str, int] = {}  # program -> live episodes here
    self.children = 0
    self.started_at = time.monotonic()
    self.retired = False
    self.hello: dict = {}
    self.next_id = itertools.count(1)

  # --- life cycle ---

  def start(self) -> None:
    """Launches the sandbox and waits for the worker's hello."""
    pool = self.pool
    os.makedirs(self.dir)
    work_args = pool.worker_args()
    if pool.backend == "gvisor":
      bundle = os.path.join(self.dir, "bundle")
      os.makedirs(bundle)
      binds = [(src, dst) for src, dst in pool.binds]
      args = [pool.python_in_sandbox, "-S", "-u", "-B"]
      args += [
          runsc.SPADE_MOUNT + "/spade/sandbox/worker.py",
          "--isolate",
          "--workdir=/tmp",
      ] + work_args
      runsc.make_bundle(
          bundle,
          args=args,
          binds=binds,
          tmpfs_mb=pool.tmpfs_mb,
          memory_limit_bytes=pool.sandbox_memory_mb << 20,
          pids_limit=pool.sandbox_pids,
          env=_SANDBOX_ENV,
      )
      try:
        self.proc, self.pid = runsc.run_detached(
            pool.runsc,
            pool.state_root,
            bundle,
            self.name,
            platform=pool.platform,
        )
      except (RuntimeError, OSError) as e:
        raise SandboxError("start", f"could not start gVisor: {e}") from None
    else:
      workdir = "/tmp"
      if pool.backend == "bwrap":
        cmd = (
            pool.bwrap_command()
            + [
                pool.python_in_sandbox,
                "-S",
                "-u",
                "-B",
                runsc.SPADE_MOUNT + "/spade/sandbox/worker.py",
                "--isolate",
                f"--workdir={workdir}",
            ]
            + work_args
        )
      else:
        workdir = os.path.join(self.dir, "work")
        os.makedirs(workdir)
        cmd = [
            sys.executable,
            "-S",
            "-u",
            "-B",
            _WORKER,
            f"--workdir={workdir}",
        ] + work_args
      self.proc = subprocess.Popen(
          cmd,
          stdin=subprocess.PIPE,
          stdout=subprocess.PIPE,
          stderr=subprocess.DEVNULL,
          close_fds=True,
          start_new_session=True,
      )
      self.pid = self.proc.pid
    _write_owner(os.path.join(self.dir, _HOST_FILE), self.pid)
    self.rfd = self.proc.stdout.fileno()
    self.wfd = self.proc.stdin.fileno()
    os.set_blocking(self.rfd, False)
    try:
      self.hello = self._read_line(time.monotonic() + pool.start_timeout_s)
    except _Lost:
      self.destroy()
      raise SandboxError(
          "start",
          f"the {pool.backend} sandbox's worker did not start; see"
          f" {self.dir}/bundle/runsc.log",
      ) from None
    if self.hello.get("errors"):
      _log.warning("sandbox preload errors: %s", self.hello["errors"])
    self.started_at = time.monotonic()

  def destroy(self) -> None:
    """Stops the sandbox and removes everything it left on the host."""
    if self.proc is not None:
      for f in (self.proc.stdin, self.proc.stdout):
        try:
          f.close()
        except OSError:
          pass
    if self.pool.backend == "gvisor":
      if self.pid:
        runsc.destroy(
            self.pool.runsc, self.pool.state_root, self.name, self.pid
        )
    elif self.proc is not None:
      try:
        os.killpg(self.proc.pid, 9)
      except OSError:
        pass
      self.proc.wait()
    shutil.rmtree(self.dir, ignore_errors=True)
    self.proc = None

  # --- protocol ---

  def send(self, items: list[dict]) -> int:
    """Writes one request; returns its id."""
    rid = next(self.next_id)
    data = json.dumps({"id": rid, "items": items}).encode() + b"\n"
    view = memoryview(data)
    try:
      while view:
        n = os.write(self.wfd, view)
        view = view[n:]
    except OSError:
      raise _Lost("the sandbox's worker is gone") from None
    return rid

  def receive(self, rid: int, deadline: float, n_items: int) -> list[dict]:
    """Reads the answer to request `rid`; raises _Lost past the deadline."""
    reply = self._read_line(deadline, cap=(n_items + 1) * self.pool.result_cap)
    if reply.get("id") != rid or not isinstance(reply.get("results"), list):
      raise _Lost(f"the worker answered out of turn: {str(reply)[:200]}")
    if len(reply["results"]) != n_items:
      raise _Lost("the worker answered the wrong number of items")
    return reply["results"]

  def _read_line(self, deadline: float, cap: int = 1 << 20) -> dict:
    while True:
      nl = self.buf.find(b"\n")
      if nl >= 0:
        line = bytes(self.buf[:nl])
        del self.buf[: nl + 1]
        try:
          value = json.loads(line)
        except ValueError:
          raise _Lost("unreadable reply from the worker") from None
        if not isinstance(value, dict):
          raise _Lost("unexpected reply from the worker")
        return value
      if len(self.buf) > cap:
        raise _Lost("the worker's reply exceeds the cap")
      left = deadline - time.monotonic()
      if left <= 0:
        raise _Lost("the sandbox missed the host deadline")
      r, _, _ = select.select([self.rfd], [], [], left)
      if not r:
        continue
      try:
        chunk = os.read(self.rfd, 1 << 20)
      except BlockingIOError:
        continue
      except OSError:
        chunk = b""
      if not chunk:
        raise _Lost("the sandbox's worker exited")
      self.buf += chunk

  def worn_out(self) -> bool:
    """True when the sandbox should take no new environments."""
    pool = self.pool
    if self.children >= pool.max_envs_per_sandbox:
      return True
    if time.monotonic() - self.started_at > pool.max_age_s:
      return True
    if (
        pool.backend == "gvisor"
        and runsc.host_tasks(self.pid) > pool.max_host_tasks
    ):
      return True
    return False


class SandboxPool:
  """Runs environment programs in a few long-lived sandboxes.

  Use as a context manager, or call `close()`. Not thread-safe across public
  calls on purpose: one lock serialises them (the rollout engine batches).

  Attributes:
    swept: what the start-up sweep removed (`sweep_orphans`'s counts).
  """

  def __init__(
      self,
      backend: str = "gvisor",
      num_sandboxes: int = 2,
      *,
      step_timeout_s: float = 5.0,
      call_timeout_s: float = 0.5,
      validate_timeout_s: float = 30.0,
      memory_mb: int = 1024,
      host_grace_s: float = 5.0,
      max_envs_per_sandbox: int = 1000,
      max_age_s: float = 3600.0,
      max_host_tasks: int = 2000,
      warm_spare: bool = True,
      preload: tuple[str, ...] | list[str] = ("numpy", "math_verify"),
      tmpfs_mb: int = 64,
      sandbox_memory_mb: int = 8192,
      nproc: int = 32,
      nofile: int = 64,
      fsize_mb: int = 16,
      max_parallel: int = 16,
      spare_envs: int = 4,
      result_cap_bytes: int = 1 << 20,
      call_output_cap_bytes: int = 256 << 10,
      timeout_strikes: int = 2,
      output_cap_bytes: int = 64 << 10,
      runsc_path: str | None = None,
      platform: str = "ptrace",
      start_timeout_s: float = 60.0,
      sweep: bool = True,
  ):
    """Starts `num_sandboxes` sandboxes (and a warm spare in the background).

    Args:
      backend: "gvisor" (default), "bwrap" (weaker: shares the host kernel) or
        "none" (no isolation; trusted code only).
      num_sandboxes: sandboxes serving environments at once.
      step_timeout_s: deadline of loading one program (its module-level
        code), and the basis of the host's deadline on a request.
      call_timeout_s: budget of one program call (`__init__`, `reset`,
        `step`, a method): a call past it ends its episode with reason
        "call_timeout"; one that ignores the timer is killed with its
        program's process (that program's episodes end, no other's).
      validate_timeout_s: deadline of one validation.
      memory_mb: address-space limit of each program's process (shared by
        that program's episodes).
      host_grace_s: margin after a worker deadline before the host gives up
        on the sandbox and replaces it.
      max_envs_per_sandbox: children (program processes, validations,
        program runs) after which a sandbox takes no new ones and is
        replaced once empty.
      max_age_s: age after which a sandbox is recycled the same way.
      max_host_tasks: host threads + ptrace stubs of a gVisor sandbox over
        which it is recycled.
      warm_spare: keep one sandbox started in the background for swaps.
      preload: modules imported once in each worker before forking.
      tmpfs_mb: size of each sandbox's writable /tmp.
      sandbox_memory_mb: cgroup memory limit of a whole gVisor sandbox.
      nproc: processes a program's uid may have.
      nofile: open files per program process.
      fsize_mb: largest file an environment may write.
      max_parallel: children one worker runs at once within a request.
      spare_envs: environment processes each worker keeps forked ahead
        (between requests), so `create` does not wait for a fork.
      result_cap_bytes: largest verdict of one validation.
      call_output_cap_bytes: largest result of one program call (JSON);
        a larger one ends its episode with reason "output_too_large".
      timeout_strikes: call timeouts after which every further call of that
        program's process fails at once (a program whose calls keep timing
        out costs a batch at most this many budgets).
      output_cap_bytes: stdout/stderr kept from `run_code`.
      runsc_path: the runsc binary (default: found on PATH).
      platform: gVisor platform ("ptrace"; "kvm" hangs on some hosts).
      start_timeout_s: how long a sandbox may take to start.
      sweep: first remove what pools of dead processes left behind (see
        `sweep_orphans`).
    """
    if backend not in BACKENDS:
      raise SandboxError(
          "config",
          f"backend={backend!r} is not one of {BACKENDS}; use 'gvisor' unless"
          " runsc cannot be installed",
      )
    if num_sandboxes < 1:
      raise SandboxError("config", "num_sandboxes must be >= 1")
    self.backend = backend
    self.num_sandboxes = num_sandboxes
    self.step_timeout_s = float(step_timeout_s)
    if call_timeout_s <= 0:
      raise SandboxError("config", "call_timeout_s must be > 0")
    self.call_timeout_s = float(call_timeout_s)
    self.call_output_cap = int(call_output_cap_bytes)
    self.timeout_strikes = int(timeout_strikes)
    self.validate_timeout_s = float(validate_timeout_s)
    self.memory_mb = int(memory_mb)
    self.host_grace_s = float(host_grace_s)
    self.max_envs_per_sandbox = int(max_envs_per_sandbox)
    self.max_age_s = float(max_age_s)
    self.max_host_tasks = int(max_host_tasks)
    self.warm_spare = bool(warm_spare)
    self.preload = tuple(preload)
    self.tmpfs_mb = int(tmpfs_mb)
    self.sandbox_memory_mb = int(sandbox_memory_mb)
    self.sandbox_pids = 4096
    self.nproc = int(nproc)
    self.nofile = int(nofile)
    self.fsize_mb = int(fsize_mb)
    self.max_parallel = int(max_parallel)
    if spare_envs < 0:
      raise SandboxError("config", "spare_envs must be >= 0")
    self.spare_envs = int(spare_envs)
    self.result_cap = int(result_cap_bytes)
    self.output_cap = int(output_cap_bytes)
    self.platform = platform
    self.start_timeout_s = float(start_timeout_s)
    self.runsc = ""
    if backend == "gvisor":
      found = runsc.find_runsc(runsc_path)
      if found is None:
        raise SandboxError("not_installed", runsc.INSTALL_HINT)
      self.runsc = found
    elif backend == "bwrap":
      if shutil.which("bwrap") is None:
        raise SandboxError(
            "not_installed",
            "bubblewrap was not found: `apt-get install bubblewrap`, or use"
            " backend='gvisor' (`apt-get install runsc`)",
        )
      _log.warning(
          "sandbox backend 'bwrap' shares the host kernel: weaker isolation"
          " than gVisor; use it only where runsc cannot run"
      )
    else:
      _log.warning(
          "sandbox backend 'none': environment code runs WITHOUT isolation;"
          " use it for trusted code only"
      )
    self.tmpdir = tempfile.mkdtemp(prefix=_DIR_PREFIX)
    # First, so that a trainer killed from here on leaves a swept directory.
    _write_owner(os.path.join(self.tmpdir, _OWNER_FILE), os.getpid())
    self.swept = {"sandboxes": 0, "processes": 0, "directories": 0}
    if sweep:
      self.swept = sweep_orphans(runsc_path=self.runsc or None)
    self.state_root = os.path.join(self.tmpdir, "runsc-state")
    os.makedirs(self.state_root)
    self._setup_paths()
    self._lock = threading.RLock()
    self._spare_lock = threading.Lock()
    self._counter = itertools.count()
    self._handles: dict[int, tuple[_Sandbox, int]] = {}
    self._lost: dict[int, str] = {}  # handle -> why it is gone
    self._next_handle = itertools.count(1)
    self._sandboxes: list[_Sandbox] = []
    self._retired: list[_Sandbox] = []
    self._spare: _Sandbox | None = None
    self._spare_thread: threading.Thread | None = None
    self._reapers: list[threading.Thread] = []
    self._closed = False
    try:
      starters = [self._new_sandbox() for _ in range(num_sandboxes)]
      self._start_all(starters)
      self._sandboxes = starters
      self._refill_spare()
    except BaseException:
      self.close()
      raise
    _OPEN_POOLS.add(self)

  @classmethod
  def from_config(cls, sandbox_config) -> "SandboxPool":
    """Builds a pool from `config.sandbox` (see spade/config.py)."""
    c = sandbox_config
    kwargs = dict(
        backend=c.backend,
        num_sandboxes=c.num_sandboxes,
        step_timeout_s=c.step_timeout_s,
        validate_timeout_s=c.validate_timeout_s,
        memory_mb=c.memory_mb,
    )
    optional = (
        "host_grace_s",
        "max_envs_per_sandbox",
        "max_age_s",
        "max_host_tasks",
        "warm_spare",
        "preload",
        "tmpfs_mb",
        "sandbox_memory_mb",
        "nproc",
        "max_parallel",
        "spare_envs",
        "call_timeout_s",
        "call_output_cap_bytes",
    )
    for key in optional:
      if key in c:
        kwargs[key] = c[key]
    if "runsc_path" in c and c.runsc_path:
      kwargs["runsc_path"] = c.runsc_path
    return cls(**kwargs)

  # --- set-up ---

  def _setup_paths(self) -> None:
    """Finds what the worker needs read-only: interpreter, packages."""
    prefix = os.path.realpath(sys.base_prefix)
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    self.python_in_sandbox = os.path.join(prefix, "bin", version)
    binds = []
    if not prefix.startswith("/usr"):
      binds.append((prefix, prefix))
    binds.append((_SPADE_DIR, runsc.SPADE_MOUNT + "/spade"))
    self._sys_paths = [runsc.SPADE_MOUNT]
    roots = []
    for name in self.preload:
      root = _module_root(name)
      if root is None:
        _log.warning("sandbox preload: %s is not installed here", name)
        continue
      if root not in roots and not root.startswith(prefix + "/lib/"):
        roots.append(root)
    for i, root in enumerate(roots):
      mount = f"{runsc.SITE_MOUNT}-{i}"
      binds.append((root, mount))
      self._sys_paths.append(mount)
    self._host_sys_paths = [os.path.dirname(_SPADE_DIR)] + roots
    self.binds = binds

  def worker_args(self) -> list[str]:
    """Worker flags shared by every backend."""
    paths = self._host_sys_paths if self.backend == "none" else self._sys_paths
    args = [f"--sys-path={p}" for p in paths]
    args += [f"--preload={m}" for m in self.preload]
    args += [f"--runtime={RUNTIME_MODULE}", f"--validator={VALIDATOR_MODULE}"]
    args += [
        f"--memory-mb={self.memory_mb}",
        f"--nproc={self.nproc}",
        f"--nofile={self.nofile}",
        f"--fsize-mb={self.fsize_mb}",
        f"--max-result-bytes={self.result_cap}",
        f"--max-output-bytes={self.output_cap}",
        f"--max-parallel={self.max_parallel}",
        f"--spare-envs={self.spare_envs}",
        f"--step-timeout-s={self.step_timeout_s}",
        f"--call-timeout-s={self.call_timeout_s}",
        f"--call-output-cap-bytes={self.call_output_cap}",
        f"--timeout-strikes={self.timeout_strikes}",
        f"--validate-timeout-s={self.validate_timeout_s}",
    ]
    return args

  def bwrap_command(self) -> list[str]:
    """bubblewrap flags equivalent to the gVisor bundle (minus the kernel)."""
    # No --die-with-parent: it fires when the *thread* that started bwrap
    # ends (sandboxes start in threads); the worker exits at EOF instead.
    cmd = [
        "bwrap",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--new-session",
        "--ro-bind",
        "/usr",
        "/usr",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
    ]
    for name in ("bin", "lib", "lib64", "sbin"):
      host = os.path.join("/", name)
      if os.path.islink(host):
        cmd += ["--symlink", os.readlink(host), host]
      elif os.path.isdir(host):
        cmd += ["--ro-bind", host, host]
    made = set()
    for src, dst in self.binds:
      # bwrap makes missing parents 0700 (root only): environments run under
      # other uids and must traverse them, e.g. /root/.pyenv/versions.
      parts = dst.strip("/").split("/")[:-1]
      for i in range(1, len(parts) + 1):
        parent = "/" + "/".join(parts[:i])
        if parent not in made and parent not in ("/usr", "/tmp", "/proc"):
          made.add(parent)
          cmd += ["--perms", "0755", "--dir", parent]
      cmd += ["--ro-bind", src, dst]
    for cap in (
        "CAP_SETUID",
        "CAP_SETGID",
        "CAP_KILL",
        "CAP_CHOWN",
        "CAP_FOWNER",
        "CAP_DAC_OVERRIDE",
        "CAP_SYS_RESOURCE",
    ):
      cmd += ["--cap-add", cap]
    return cmd

  def _new_sandbox(self) -> _Sandbox:
    return _Sandbox(self, next(self._counter))

  def _start_all(self, sandboxes: list[_Sandbox]) -> None:
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
    if not self.warm_spare or self._closed:
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

  def _take_fresh(self) -> _Sandbox:
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

  def _destroy_later(self, sb: _Sandbox) -> None:
    """`runsc delete` takes ~1.5 s: do it off the caller's path."""
    t = threading.Thread(target=sb.destroy, daemon=True)
    t.start()
    self._reapers.append(t)
    self._reapers = [r for r in self._reapers if r.is_alive()]

  def _replace(self, sb: _Sandbox, why: str) -> None:
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
    if not self._closed and len(self._sandboxes) < self.num_sandboxes:
      self._sandboxes.append(self._take_fresh())

  def _retire_if_worn(self, sb: _Sandbox) -> None:
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
      self, per_sandbox: dict[_Sandbox, list[dict]], timeout_s: float
  ) -> dict[_Sandbox, list[dict] | str]:
    """Sends one request to each sandbox, then collects all answers.

    A sandbox that dies or misses `timeout_s + host_grace_s` is replaced and
    its entry is the reason string instead of results.
    """
    sent = {}
    out: dict[_Sandbox, Any] = {}
    for sb, items in per_sandbox.items():
      try:
        sent[sb] = sb.send(items)
      except _Lost as e:
        out[sb] = str(e)
    deadline = time.monotonic() + timeout_s + self.host_grace_s
    for sb, rid in sent.items():
      try:
        out[sb] = sb.receive(rid, deadline, len(per_sandbox[sb]))
      except _Lost as e:
        out[sb] = str(e)
    for sb, value in out.items():
      if isinstance(value, str):
        _log.warning("sandbox %s lost (%s); replacing it", sb.name, value)
        self._replace(sb, value)
    return out

  def _check_open(self) -> None:
    if self._closed:
      raise SandboxError("closed", "the pool is closed; make a new SandboxPool")

  def _owner(self, handle: int) -> tuple[_Sandbox, int]:
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
      self, source: str, load: dict[_Sandbox, int] | None = None
  ) -> _Sandbox:
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
  def _add_env(sb: _Sandbox, env: int, source: str) -> None:
    sb.envs.add(env)
    sb.env_source[env] = source
    sb.sources[source] = sb.sources.get(source, 0) + 1

  @staticmethod
  def _drop_env(sb: _Sandbox, env: int) -> None:
    sb.envs.discard(env)
    source = sb.env_source.pop(env, None)
    if source is not None:
      sb.sources[source] -= 1
      if not sb.sources[source]:
        del sb.sources[source]

  def _one(self, sb: _Sandbox, item: dict, timeout_s: float) -> dict:
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
          "time_budget_s", max(1.0, 0.8 * self.validate_timeout_s)
      )
      options.setdefault("call_timeout_s", self.call_timeout_s)
      verdicts: list[dict | None] = [None] * len(sources)
      per: dict[_Sandbox, list[dict]] = {}
      where: dict[_Sandbox, list[int]] = {}
      for i, source in enumerate(sources):
        sb = self._sandboxes[i % len(self._sandboxes)]
        per.setdefault(sb, []).append(
            {
                "op": "validate",
                "source": source,
                "options": options,
                "timeout_s": self.validate_timeout_s,
            }
        )
        where.setdefault(sb, []).append(i)
      rounds = (
          -(-max(len(v) for v in per.values()) // self.max_parallel)
          if per
          else 0
      )
      answers = self._request(per, self.validate_timeout_s * max(rounds, 1))
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
          self.step_timeout_s,
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
      per: dict[_Sandbox, list[dict]] = {}
      where: dict[_Sandbox, list[int]] = {}
      load = {sb: len(sb.envs) for sb in self._sandboxes}
      home: dict[str, _Sandbox] = {}  # a program's episodes stay together
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
            self.step_timeout_s * (1 + -(-programs // self.max_parallel))
            + len(sb_items) * (2 + calls) * self.call_timeout_s,
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
          sb, {"op": "reset", "env": env, "seed": seed}, self.step_timeout_s
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
      per: dict[_Sandbox, list[dict]] = {}
      where: dict[_Sandbox, list[int]] = {}
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
      self, per: dict[_Sandbox, list[dict]]
  ) -> dict[_Sandbox, list[dict] | str]:
    """Sends batches of calls on existing episodes; collects the answers."""
    # The calls on one program run in order in its process, each within
    # call_timeout_s: a batch can take that long.
    depth = max((len(v) for v in per.values()), default=1)
    return self._request(per, self.step_timeout_s + depth * self.call_timeout_s)

  def call(self, handle: int, method: str, *args) -> Any:
    """Calls a public method of the environment (e.g. "hint", "solution")."""
    with self._lock:
      self._check_open()
      sb, env = self._owner(handle)
      r = self._one(
          sb,
          {"op": "call", "env": env, "method": method, "args": list(args)},
          self.step_timeout_s,
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
      self._one(sb, {"op": "close", "env": env}, self.step_timeout_s)
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
          {sb: [{"op": "stats"}] for sb in self._sandboxes}, self.step_timeout_s
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
    if self.backend == "gvisor":
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


def _write_owner(path: str, pid: int) -> None:
  """Records a process (pid and start time) as the owner of a directory."""
  with open(path, "w") as f:
    json.dump({"pid": pid, "start": runsc.start_time(pid)}, f)


def _read_owner(path: str) -> tuple[int, str | None] | None:
  try:
    with open(path) as f:
      owner = json.load(f)
    return int(owner["pid"]), owner.get("start")
  except (OSError, ValueError, KeyError, TypeError):
    return None


def sweep_orphans(
    tmp_root: str | None = None, runsc_path: str | None = None
) -> dict[str, int]:
  """Removes the sandboxes and state directories of pools whose owner died.

  A trainer killed with SIGKILL never closes its pool. Each pool's directory
  names its owner (pid and start time, so a reused pid does not count as
  alive); for every directory whose owner is gone this kills the host
  processes of its sandboxes (recorded per sandbox, and any process whose
  command line names the directory: runsc's sandbox and gofer, a bwrap or
  plain worker), deletes its gVisor containers (`runsc delete -force`:
  state and cgroups) and removes the directory. Directories of live owners,
  or without an owner file, are left alone.

  Returns:
    {"sandboxes", "processes", "directories"}: how many were removed.
  """
  root = tmp_root or tempfile.gettempdir()
  removed = {"sandboxes": 0, "processes": 0, "directories": 0}
  try:
    names = sorted(n for n in os.listdir(root) if n.startswith(_DIR_PREFIX))
  except OSError:
    return removed
  binary = None
  for name in names:
    path = os.path.join(root, name)
    owner = _read_owner(os.path.join(path, _OWNER_FILE))
    if owner is None or runsc.is_running(*owner):
      continue
    pids = set(runsc.processes_naming(path))
    for sb_dir in glob.glob(os.path.join(path, "sb*")):
      host = _read_owner(os.path.join(sb_dir, _HOST_FILE))
      if host is not None and runsc.is_running(*host):
        pids.add(host[0])
      removed["sandboxes"] += 1
    for pid in pids:
      try:
        os.kill(pid, 9)
        removed["processes"] += 1
      except OSError:
        pass
    state_root = os.path.join(path, "runsc-state")
    ids = runsc.leftover_ids(state_root)
    if ids:
      binary = binary or runsc.find_runsc(runsc_path)
      if binary is None:
        _log.warning("cannot delete %s's containers: no runsc", path)
        continue
      for cid in ids:
        runsc.destroy(binary, state_root, cid, 0)
    shutil.rmtree(path, ignore_errors=True)
    removed["directories"] += 1
  if removed["directories"]:
    _log.info(
        "removed %d sandboxes (%d host processes) and %d state directories"
        " left by dead trainers",
        removed["sandboxes"],
        removed["processes"],
        removed["directories"],
    )
  return removed


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
