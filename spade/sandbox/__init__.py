"""Untrusted environment programs, run in gVisor sandboxes.

`SandboxPool` (pool.py) is the API the trainer, the validator CLI and the
evaluation suites use; `worker.py` runs inside each sandbox; `runsc.py` wraps
gVisor's command line.
"""

from spade.sandbox.pool import BACKENDS
from spade.sandbox.pool import SandboxError
from spade.sandbox.pool import SandboxPool

__all__ = ["BACKENDS", "SandboxError", "SandboxPool"]
