"""Untrusted environment programs, run in gVisor sandboxes.

`SandboxPool` (pool.py) is the API the trainer, the validator CLI and the
evaluation suites use, configured by `PoolOptions` (options.py); backends.py
starts and speaks to one sandbox, sweep.py removes what dead pools left and
runsc.py wraps gVisor's command line. Inside each sandbox runs worker.py
(the supervisor), with program_child.py (its forked children) and wire.py
(their framing): standard library only.
"""

from spade.sandbox.errors import SandboxError
from spade.sandbox.options import BACKENDS
from spade.sandbox.options import PoolOptions
from spade.sandbox.pool import SandboxPool

__all__ = ["BACKENDS", "PoolOptions", "SandboxError", "SandboxPool"]
