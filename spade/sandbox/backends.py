"""The backends: how one sandbox is started, spoken to and stopped.

Every backend runs `worker.py` as the sandbox's init, speaking JSON lines
over its stdin/stdout pipes:

  "gvisor"  a gVisor container (`runsc run --detach`, no network, read-only
            root, tmpfs `/tmp`); the default.
  "bwrap"   bubblewrap: the same binds and capabilities in namespaces on
            the host kernel, announced as weaker.
  "none"    a plain subprocess for trusted code only; never chosen
            implicitly.

`Launch` is what every sandbox of one pool shares (options, paths, binds);
`Sandbox` is the host side of one sandbox.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import json
import logging
import os
import select
import shutil
import subprocess
import sys
import time

from spade.sandbox import runsc
from spade.sandbox import sweep
from spade.sandbox.errors import SandboxError
from spade.sandbox.options import PoolOptions

_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")
_SPADE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The program runtime the worker serves, named rather than imported: a module
# with load_program(source), instantiate(cls, kwargs) and ProgramError, and a
# validator module with validate_program(source, **options) (spade.environments'
# own). The worker imports both by name before forking (a fork inherits
# them), so this package never imports the environment package that uses it.
RUNTIME_MODULE = "spade.environments.runtime"
VALIDATOR_MODULE = "spade.environments.validator"

# One BLAS thread: environments are single-threaded, and every thread pool
# numpy starts in the worker would be copied into each forked environment.
_SANDBOX_ENV = [
    "PATH=/usr/bin:/bin",
    "LANG=C.UTF-8",
    "OPENBLAS_NUM_THREADS=1",
    "OMP_NUM_THREADS=1",
    "MKL_NUM_THREADS=1",
]

# cgroup limit on the host tasks of one gVisor sandbox (ptrace stubs).
_SANDBOX_PIDS = 4096

_log = logging.getLogger(__name__)


class Lost(Exception):
  """A sandbox's worker that died or missed the host deadline."""


def check_installed(options: PoolOptions) -> str:
  """The runsc binary for "gvisor" ("" otherwise); announces weak backends.

  Raises:
    SandboxError: "not_installed", with the command that installs it.
  """
  if options.backend == "gvisor":
    found = runsc.find_runsc(options.runsc_path)
    if found is None:
      raise SandboxError("not_installed", runsc.INSTALL_HINT)
    return found
  if options.backend == "bwrap":
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
  return ""


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


@dataclasses.dataclass(frozen=True)
class Launch:
  """What every sandbox of one pool shares.

  Attributes:
    options: the pool's options.
    tmpdir: the pool's state directory (one `sb<i>` directory per sandbox).
    state_root: runsc's `--root` (gVisor only).
    runsc: the runsc binary ("" for the other backends).
    python: the interpreter, at the same path inside the sandbox.
    binds: (host path, sandbox path) pairs, mounted read-only.
    sys_paths: the worker's sys.path entries inside a sandbox.
    host_sys_paths: the same on the host (backend "none").
  """

  options: PoolOptions
  tmpdir: str
  state_root: str
  runsc: str
  python: str
  binds: tuple[tuple[str, str], ...]
  sys_paths: tuple[str, ...]
  host_sys_paths: tuple[str, ...]

  @classmethod
  def make(
      cls, options: PoolOptions, tmpdir: str, state_root: str, binary: str
  ) -> "Launch":
    """Finds what the worker needs read-only: interpreter, packages."""
    prefix = os.path.realpath(sys.base_prefix)
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    binds = []
    if not prefix.startswith("/usr"):
      binds.append((prefix, prefix))
    binds.append((_SPADE_DIR, runsc.SPADE_MOUNT + "/spade"))
    sys_paths = [runsc.SPADE_MOUNT]
    roots = []
    for name in options.preload:
      root = _module_root(name)
      if root is None:
        _log.warning("sandbox preload: %s is not installed here", name)
        continue
      if root not in roots and not root.startswith(prefix + "/lib/"):
        roots.append(root)
    for i, root in enumerate(roots):
      mount = f"{runsc.SITE_MOUNT}-{i}"
      binds.append((root, mount))
      sys_paths.append(mount)
    return cls(
        options=options,
        tmpdir=tmpdir,
        state_root=state_root,
        runsc=binary,
        python=os.path.join(prefix, "bin", version),
        binds=tuple(binds),
        sys_paths=tuple(sys_paths),
        host_sys_paths=tuple([os.path.dirname(_SPADE_DIR)] + roots),
    )

  def worker_args(self) -> list[str]:
    """Worker flags shared by every backend."""
    o = self.options
    paths = self.host_sys_paths if o.backend == "none" else self.sys_paths
    args = [f"--sys-path={p}" for p in paths]
    args += [f"--preload={m}" for m in o.preload]
    args += [f"--runtime={RUNTIME_MODULE}", f"--validator={VALIDATOR_MODULE}"]
    args += [
        f"--memory-mb={o.memory_mb}",
        f"--nproc={o.nproc}",
        f"--nofile={o.nofile}",
        f"--fsize-mb={o.fsize_mb}",
        f"--max-result-bytes={o.result_cap_bytes}",
        f"--max-output-bytes={o.output_cap_bytes}",
        f"--max-parallel={o.max_parallel}",
        f"--spare-envs={o.spare_envs}",
        f"--step-timeout-s={o.step_timeout_s}",
        f"--call-timeout-s={o.call_timeout_s}",
        f"--call-output-cap-bytes={o.call_output_cap_bytes}",
        f"--timeout-strikes={o.timeout_strikes}",
        f"--validate-timeout-s={o.validate_timeout_s}",
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
    for cap in runsc.CAPABILITIES:
      cmd += ["--cap-add", cap]
    return cmd


class Sandbox:
  """Host side of one sandbox: its worker's pipes and bookkeeping."""

  def __init__(self, launch: Launch, index: int):
    self.launch = launch
    self.index = index
    # runsc names its control socket after the id (an abstract socket, global
    # to the host): unique per pool, not just per process.
    token = os.path.basename(launch.tmpdir).rsplit("-", 1)[-1]
    self.name = f"spade-{os.getpid()}-{token}-{index}"
    self.dir = os.path.join(launch.tmpdir, f"sb{index}")
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
    launch = self.launch
    options = launch.options
    os.makedirs(self.dir)
    work_args = launch.worker_args()
    if options.backend == "gvisor":
      bundle = os.path.join(self.dir, "bundle")
      os.makedirs(bundle)
      args = [launch.python, "-S", "-u", "-B"]
      args += [
          runsc.SPADE_MOUNT + "/spade/sandbox/worker.py",
          "--isolate",
          "--workdir=/tmp",
      ] + work_args
      runsc.make_bundle(
          bundle,
          args=args,
          binds=list(launch.binds),
          tmpfs_mb=options.tmpfs_mb,
          memory_limit_bytes=options.sandbox_memory_mb << 20,
          pids_limit=_SANDBOX_PIDS,
          env=_SANDBOX_ENV,
      )
      try:
        self.proc, self.pid = runsc.run_detached(
            launch.runsc,
            launch.state_root,
            bundle,
            self.name,
            platform=options.platform,
        )
      except (RuntimeError, OSError) as e:
        raise SandboxError("start", f"could not start gVisor: {e}") from None
    else:
      workdir = "/tmp"
      if options.backend == "bwrap":
        cmd = (
            launch.bwrap_command()
            + [
                launch.python,
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
    sweep.write_owner(os.path.join(self.dir, sweep.HOST_FILE), self.pid)
    self.rfd = self.proc.stdout.fileno()
    self.wfd = self.proc.stdin.fileno()
    os.set_blocking(self.rfd, False)
    try:
      self.hello = self._read_line(time.monotonic() + options.start_timeout_s)
    except Lost:
      self.destroy()
      raise SandboxError(
          "start",
          f"the {options.backend} sandbox's worker did not start; see"
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
    if self.launch.options.backend == "gvisor":
      if self.pid:
        runsc.destroy(
            self.launch.runsc, self.launch.state_root, self.name, self.pid
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
      raise Lost("the sandbox's worker is gone") from None
    return rid

  def receive(self, rid: int, deadline: float, n_items: int) -> list[dict]:
    """Reads the answer to request `rid`; raises Lost past the deadline."""
    cap = (n_items + 1) * self.launch.options.result_cap_bytes
    reply = self._read_line(deadline, cap=cap)
    if reply.get("id") != rid or not isinstance(reply.get("results"), list):
      raise Lost(f"the worker answered out of turn: {str(reply)[:200]}")
    if len(reply["results"]) != n_items:
      raise Lost("the worker answered the wrong number of items")
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
          raise Lost("unreadable reply from the worker") from None
        if not isinstance(value, dict):
          raise Lost("unexpected reply from the worker")
        return value
      if len(self.buf) > cap:
        raise Lost("the worker's reply exceeds the cap")
      left = deadline - time.monotonic()
      if left <= 0:
        raise Lost("the sandbox missed the host deadline")
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
        raise Lost("the sandbox's worker exited")
      self.buf += chunk

  def worn_out(self) -> bool:
    """True when the sandbox should take no new environments."""
    options = self.launch.options
    if self.children >= options.max_envs_per_sandbox:
      return True
    if time.monotonic() - self.started_at > options.max_age_s:
      return True
    if (
        options.backend == "gvisor"
        and runsc.host_tasks(self.pid) > options.max_host_tasks
    ):
      return True
    return False
