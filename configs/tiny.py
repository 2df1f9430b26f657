"""Tiny randomly initialised byte-level model: the fast path for tests and CI.

It proves the pipeline, not learning. Run:

  python -m spade.main --config=configs/tiny.py --workdir=/tmp/spade_tiny
  python -m spade.main --config=configs/tiny.py:smoke --workdir=/tmp/smoke
"""

from spade import config as config_lib


def get_config(arg=None):
  """Returns the tiny config; `arg="smoke"` shrinks it to one short step."""
  c = config_lib.base_config()
  c.num_iterations = 2
  if arg == "smoke":
    c.num_iterations = 1
    c.designer.num_envs = 1
    c.agent.episodes_per_env = 1
    c.agent.max_turns = 2
    c.agent.max_new_tokens = 8
    c.designer.max_new_tokens = 32
  elif arg not in (None, ""):
    raise ValueError(f"configs/tiny.py has no variant {arg!r} (try 'smoke')")
  return c
