"""The options of a sandbox pool: one frozen record, checked when made."""

from __future__ import annotations

import dataclasses

from spade.sandbox.errors import SandboxError

BACKENDS = ("gvisor", "bwrap", "none")

# Field type (as written below) -> the conversion applied to its value, so
# that a config's int for a float field (or list for a tuple) is normalised.
_KINDS = {"int": int, "float": float, "bool": bool, "tuple[str, ...]": tuple}


@dataclasses.dataclass(frozen=True)
class PoolOptions:
  """How a `SandboxPool` runs its sandboxes and the programs in them.

  Attributes:
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
      `sweep.sweep_orphans`).
  """

  backend: str = "gvisor"
  num_sandboxes: int = 2
  step_timeout_s: float = 5.0
  call_timeout_s: float = 0.5
  validate_timeout_s: float = 30.0
  memory_mb: int = 1024
  host_grace_s: float = 5.0
  max_envs_per_sandbox: int = 1000
  max_age_s: float = 3600.0
  max_host_tasks: int = 2000
  warm_spare: bool = True
  preload: tuple[str, ...] = ("numpy", "math_verify")
  tmpfs_mb: int = 64
  sandbox_memory_mb: int = 8192
  nproc: int = 32
  nofile: int = 64
  fsize_mb: int = 16
  max_parallel: int = 16
  spare_envs: int = 4
  result_cap_bytes: int = 1 << 20
  call_output_cap_bytes: int = 256 << 10
  timeout_strikes: int = 2
  output_cap_bytes: int = 64 << 10
  runsc_path: str | None = None
  platform: str = "ptrace"
  start_timeout_s: float = 60.0
  sweep: bool = True

  def __post_init__(self):
    if self.backend not in BACKENDS:
      raise SandboxError(
          "config",
          f"backend={self.backend!r} is not one of {BACKENDS}; use 'gvisor'"
          " unless runsc cannot be installed",
      )
    if self.num_sandboxes < 1:
      raise SandboxError("config", "num_sandboxes must be >= 1")
    if self.call_timeout_s <= 0:
      raise SandboxError("config", "call_timeout_s must be > 0")
    if self.spare_envs < 0:
      raise SandboxError("config", "spare_envs must be >= 0")
    for field in dataclasses.fields(self):
      kind = _KINDS.get(field.type)
      if kind is not None:
        object.__setattr__(self, field.name, kind(getattr(self, field.name)))
