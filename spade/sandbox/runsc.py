"""A thin wrapper around gVisor's `runsc`: OCI bundles, start, stop.

The `gvisor` PyPI package's one-shot `Sandbox` takes ~2 s to close and runs
`sleep infinity` as init, so the pool drives `runsc` itself: one
`runsc run --detach` per long-lived sandbox, whose init is our worker with its
stdin/stdout attached to the pipes of the `runsc` process (gVisor hands the
caller's stdio to the container's init and `runsc` returns at once).

The bundle's root is an empty, read-only directory of our own; only what
Python needs is bound into it, read-only: `/usr` (with `/bin`, `/lib`,
`/lib64` as the usual symlinks), the interpreter's prefix, one site-packages
directory and the `spade` package. `/tmp` is a small tmpfs, there is no
network, and every piece of state (`--root`, bundles) lives under a private
temporary directory, so cleanup is complete.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time

# Where things appear inside the sandbox.
SPADE_MOUNT = "/opt/spade"
SITE_MOUNT = "/opt/site-packages"

# The capabilities of a sandbox's init (the worker), in gVisor and in
# bubblewrap alike (`backends.bwrap_command`): it gives each environment its
# own uid (SETUID, SETGID) and 0700 directory, which it also removes (CHOWN,
# FOWNER, DAC_OVERRIDE), kills every process of that uid (KILL) and sets its
# rlimits (SYS_RESOURCE). Nothing else.
CAPABILITIES = (
    "CAP_SETUID",
    "CAP_SETGID",
    "CAP_KILL",
    "CAP_CHOWN",
    "CAP_FOWNER",
    "CAP_DAC_OVERRIDE",
    "CAP_SYS_RESOURCE",
)

INSTALL_HINT = (
    "gVisor's runsc was not found on PATH. Install it with `apt-get install"
    " runsc` (Debian/Ubuntu), or choose the weaker bubblewrap backend"
    " explicitly with config.sandbox.backend='bwrap'."
)


def find_runsc(path: str | None = None) -> str | None:
  """Returns the runsc binary to use, or None when it is not installed."""
  if path:
    return path if os.access(path, os.X_OK) else None
  return shutil.which("runsc")


def _bind(source: str, destination: str) -> dict:
  return {
      "destination": destination,
      "type": "bind",
      "source": source,
      "options": ["rbind", "ro", "nosuid", "nodev"],
  }


def make_bundle(
    bundle_dir: str,
    *,
    args: list[str],
    binds: list[tuple[str, str]],
    tmpfs_mb: int,
    memory_limit_bytes: int,
    pids_limit: int,
    env: list[str],
) -> str:
  """Writes an OCI bundle (`config.json` + an empty rootfs) and returns it.

  Args:
    bundle_dir: a fresh directory owned by the caller.
    args: the init process's argv.
    binds: (host path, sandbox path) pairs, all mounted read-only.
    tmpfs_mb: size of the writable `/tmp`.
    memory_limit_bytes: cgroup memory limit of the whole sandbox (the sentry
      and every process in it); a backstop behind the per-environment rlimits.
    pids_limit: cgroup limit on host tasks of the sandbox (ptrace stubs).
    env: the init process's environment, "KEY=value" strings.
  """
  rootfs = os.path.join(bundle_dir, "rootfs")
  os.makedirs(rootfs, exist_ok=True)
  # Mount points must exist in a read-only root; /bin, /lib... are symlinks
  # into /usr on merged-/usr systems, and copies of what the host has.
  for name in ("bin", "lib", "lib64", "sbin"):
    host = os.path.join("/", name)
    if os.path.islink(host):
      os.symlink(os.readlink(host), os.path.join(rootfs, name))
    elif os.path.isdir(host):
      os.makedirs(os.path.join(rootfs, name), exist_ok=True)
      binds = binds + [(host, host)]
  for d in ("proc", "tmp", "dev", "usr"):
    os.makedirs(os.path.join(rootfs, d), exist_ok=True)
  mounts = [
      {"destination": "/proc", "type": "proc", "source": "proc"},
      {
          "destination": "/tmp",
          "type": "tmpfs",
          "source": "tmpfs",
          "options": ["nosuid", "nodev", f"size={tmpfs_mb}m", "mode=0711"],
      },
      _bind("/usr", "/usr"),
  ]
  for source, destination in binds:
    os.makedirs(rootfs + destination, exist_ok=True)
    mounts.append(_bind(source, destination))
  caps = list(CAPABILITIES)
  spec = {
      "ociVersion": "1.0.0",
      "process": {
          "terminal": False,
          "user": {"uid": 0, "gid": 0},
          "args": args,
          "env": env,
          "cwd": "/tmp",
          "capabilities": {
              "bounding": caps,
              "effective": caps,
              "permitted": caps,
          },
          "rlimits": [{"type": "RLIMIT_CORE", "hard": 0, "soft": 0}],
          "noNewPrivileges": True,
      },
      "root": {"path": rootfs, "readonly": True},
      "hostname": "sandbox",
      "mounts": mounts,
      "linux": {
          "namespaces": [
              {"type": t} for t in ("pid", "network", "ipc", "uts", "mount")
          ],
          "resources": {
              "memory": {"limit": int(memory_limit_bytes)},
              "pids": {"limit": int(pids_limit)},
          },
      },
  }
  with open(os.path.join(bundle_dir, "config.json"), "w") as f:
    json.dump(spec, f, indent=1)
  return bundle_dir


def run_detached(
    runsc: str,
    state_root: str,
    bundle_dir: str,
    container_id: str,
    *,
    platform: str = "ptrace",
    timeout_s: float = 30.0,
) -> tuple[subprocess.Popen, int]:
  """Starts a sandbox; returns (runsc process with the init's pipes, pid).

  The returned process has already exited (`--detach`); its `stdin`/`stdout`
  are the worker's protocol pipes. The pid is the host's `runsc-sandbox`.
  """
  pid_file = os.path.join(bundle_dir, "sandbox.pid")
  log_file = os.path.join(bundle_dir, "runsc.log")
  cmd = [
      runsc,
      f"--root={state_root}",
      "--network=none",
      f"--platform={platform}",
      "--host-uds=none",
      "run",
      "--detach",
      f"--pid-file={pid_file}",
      f"--bundle={bundle_dir}",
      container_id,
  ]
  with open(log_file, "wb") as log:
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        close_fds=True,
    )
    try:
      rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
      rc = -1
  if rc != 0:
    with open(log_file, "rb") as f:
      tail = f.read()[-2000:].decode("utf-8", "replace")
    proc.stdin.close()
    proc.stdout.close()
    raise RuntimeError(f"runsc run failed (exit {rc}): {tail.strip()}")
  with open(pid_file) as f:
    pid = int(f.read().strip())
  return proc, pid


def destroy(runsc: str, state_root: str, container_id: str, pid: int) -> None:
  """Kills a sandbox and removes its state and cgroups (`runsc delete`).

  SIGKILL to the sandbox process first, so the slow part of `delete` (it
  polls for the sandbox to exit) has nothing to wait for.
  """
  if pid > 0:  # never 0 or -1: those would signal our own group / all
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
  subprocess.run(
      [runsc, f"--root={state_root}", "delete", "-force", container_id],
      stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL,
      timeout=60,
      check=False,
  )


def leftover_ids(state_root: str) -> list[str]:
  """Container ids that still have state under `state_root`."""
  try:
    names = os.listdir(state_root)
  except OSError:
    return []
  return [
      n[: -len(".state")].split(":")[-1] for n in names if n.endswith(".state")
  ]


def host_tasks(pid: int) -> int:
  """Host threads of a sandbox process plus its direct children (stubs)."""
  try:
    tasks = os.listdir(f"/proc/{pid}/task")
  except OSError:
    return 0
  total = len(tasks)
  for tid in tasks:
    try:
      with open(f"/proc/{pid}/task/{tid}/children") as f:
        total += len(f.read().split())
    except OSError:
      pass
  return total


def rss_bytes(pid: int) -> int:
  """Memory of a sandbox process and its direct children (ptrace stubs).

  Proportional set size: the stubs map the same application memory as the
  sentry, so plain RSS would count it once per process.
  """
  pids = [pid]
  try:
    for tid in os.listdir(f"/proc/{pid}/task"):
      with open(f"/proc/{pid}/task/{tid}/children") as f:
        pids += [int(p) for p in f.read().split()]
  except OSError:
    pass
  total = 0
  for p in pids:
    try:
      with open(f"/proc/{p}/smaps_rollup") as f:
        for line in f:
          if line.startswith("Pss:"):
            total += int(line.split()[1]) * 1024
            break
    except OSError:
      pass
  return total


def wait_gone(pid: int, timeout_s: float) -> bool:
  """Polls until a non-child process has exited; True when it has."""
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    if not os.path.exists(f"/proc/{pid}"):
      return True
    time.sleep(0.01)
  return not os.path.exists(f"/proc/{pid}")


def start_time(pid: int) -> str | None:
  """A process's start time (clock ticks since boot), or None when gone.

  A pid and its start time name one process: a pid reused by a new process
  has a later start time.
  """
  try:
    with open(f"/proc/{pid}/stat") as f:
      stat = f.read()
  except OSError:
    return None
  # The command name (field 2) may hold spaces and parentheses.
  return stat.rsplit(")", 1)[-1].split()[19]


def is_running(pid: int, started: str | None) -> bool:
  """Whether process `pid` still runs and is the one that started then."""
  return pid > 0 and started is not None and start_time(pid) == started


def processes_naming(path: str) -> list[int]:
  """Host processes whose command line names `path` (a sandbox's dirs)."""
  found = []
  needle = path.rstrip("/").encode() + b"/"
  for name in os.listdir("/proc"):
    if not name.isdigit():
      continue
    try:
      with open(f"/proc/{name}/cmdline", "rb") as f:
        if needle in f.read():
          found.append(int(name))
    except OSError:
      pass
  return found
