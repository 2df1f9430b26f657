"""The sandbox pool a config asks for: `config.sandbox` with its budgets.

`from_config` resolves the named budgets (`sandbox.budgets`,
`spade.environments.budget`) into the pool's deadlines, so the pool
(`spade.sandbox`) knows numbers only and imports nothing of this package.
Host side: the sandbox worker never imports it.
"""

from __future__ import annotations

from spade.environments import budget
from spade.sandbox import pool as pool_lib

# `config.sandbox` keys passed to the pool as they are, when present.
_OPTIONAL = (
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
    "call_output_cap_bytes",
)


def from_config(sandbox_config) -> pool_lib.SandboxPool:
  """Starts a pool from `config.sandbox` (see spade/config.py).

  The load, call and validation deadlines are `sandbox.budgets`' (the
  reference's by default, `budget.BUDGETS`), each replaced by its key when
  that is > 0.
  """
  c = sandbox_config
  limits = budget.resolve(
      c.get("budgets", budget.DEFAULT),
      call_timeout_s=c.get("call_timeout_s", 0.0),
      validate_timeout_s=c.get("validate_timeout_s", 0.0),
      load_timeout_s=c.get("step_timeout_s", 0.0),
  )
  kwargs = dict(
      backend=c.backend,
      num_sandboxes=c.num_sandboxes,
      step_timeout_s=limits.load_timeout_s,
      call_timeout_s=limits.call_timeout_s,
      validate_timeout_s=limits.validate_timeout_s,
      memory_mb=c.memory_mb,
  )
  for key in _OPTIONAL:
    if key in c:
      kwargs[key] = c[key]
  if "runsc_path" in c and c.runsc_path:
    kwargs["runsc_path"] = c.runsc_path
  return pool_lib.SandboxPool(**kwargs)
