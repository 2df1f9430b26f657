"""Tiny randomly initialised byte-level model: the fast path for tests and CI.

The default proves the pipeline, not learning; `learn` learns. Sampling
goes through the slot engine (`spade.sampling.slot_server`). Run:

  python -m spade.main --config=configs/tiny.py --workdir=/tmp/spade_tiny
  python -m spade.main --config=configs/tiny.py:smoke --workdir=/tmp/smoke
  python -m spade.main --config=configs/tiny.py:learn --workdir=/tmp/learn

`learn` plays a fixed pool of trivial programs (reply with a leading digit,
spade/environments/pools/trivial/; random bytes win a few percent) with a
learning rate the tiny model can move with: `agent/return_nohint` rises
within a few minutes on a laptop CPU (tests/learning/test_end_to_end.py).
"""

import os

from spade import config as config_lib
from spade import environments

TRIVIAL_POOL = os.path.join(
    os.path.dirname(environments.__file__), "pools", "trivial"
)


def get_config(arg=None):
  """Returns the tiny config; `arg` picks a variant ("smoke", "learn")."""
  c = config_lib.base_config()
  c.num_iterations = 2
  # Ours, not the reference's sampling (temperature 0.6, top-k 20, top-p
  # 0.95): a random byte model's next byte is close to uniform, so top-k 20
  # would cut most of what it can write; every role samples its whole
  # distribution, as the learning checks' figures were measured.
  for role in (c.designer, c.agent):
    role.temperature, role.top_k, role.top_p = 1.0, 0, 1.0
  # A byte model's context holds only the instructions' tail: cut them from
  # the left (ours) instead of refusing the budget.
  c.designer.prompt_overflow = "cut_left"
  # The base's batch of 192 samples stays: a few episodes fill it as
  # copies, so the update scores no extra row. Under `learn` (no designer)
  # its 32 unhinted episodes count 6 times each, so an episode's row weighs
  # 6 / 192 = 1 / 32, as it did divided by the rows there were.
  if arg == "smoke":
    c.num_iterations = 1
    c.designer.num_envs = 1
    c.agent.episodes_per_env = 1
    c.agent.max_turns = 2
    c.agent.max_new_tokens = 8
    c.designer.max_new_tokens = 32
    # The random model's programs are never valid: one retry shows the
    # mechanism without eight samples per design.
    c.designer.max_attempts = 2
    # Two episodes and one design a round: a few slots serve them.
    c.sampling.slots = 4
    c.sampling.prefill_rows = 2
  elif arg == "learn":
    c.num_iterations = 16
    c.train.mode = "fixed_pool"
    c.train.pool_dir = TRIVIAL_POOL
    c.train.checkpoint_every = 1000  # the final one only
    c.optim.learning_rate = 3e-3
    # Environments per iteration (drawn from the pool with replacement) and
    # episodes per arm: 8 x 4 x 2 = 64 episodes, enough wins to learn from
    # at a few percent.
    c.designer.num_envs = 8
    c.agent.episodes_per_env = 4
    c.agent.max_turns = 2
    c.agent.max_new_tokens = 8
    # A random byte model seldom ends a reply within 8 tokens: under the
    # reference's rule (an unfinished reply ends the episode unstepped) it
    # would never be paid, so its replies are stepped as they are (ours).
    c.agent.unfinished_reply = "step"
    c.sandbox.num_sandboxes = 1
    c.sandbox.preload = ()  # the trivial programs import nothing
  elif arg not in (None, ""):
    raise ValueError(
        f"configs/tiny.py has no variant {arg!r} (try 'smoke' or 'learn')"
    )
  return c
