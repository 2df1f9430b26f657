"""One process per program: episodes share it, programs never do; budgets.

The episodes of one environment program run as instances of its class in
one sandboxed process; different programs run in different processes under
different uids. These tests check that sharing leaks no episode state, that
a failure stays inside its program, and the per-call budgets in play.
"""

import random

import numpy as np
import pytest

from spade.sandbox import SandboxPool
from tests.sandbox.conftest import CALL_TIMEOUT_S
from tests.sandbox.conftest import assert_pool_works
from tests.sandbox.conftest import program
from tests.sandbox.test_pool import TOOL_USE

pytestmark = pytest.mark.sandbox

# Reports its process, uid, instance state and the global generator's draws.
STATEFUL = '''
class StatefulEnv:
  """Keeps the actions it was given; seeds the global generator."""

  def __init__(self, **kwargs):
    self.actions = []

  def reset(self, seed=None):
    self.actions = []
    random.seed(seed)
    np.random.seed(seed)
    return "ready", {}

  def step(self, action):
    import os
    self.actions.append(action)
    draws = (random.random(), float(np.random.random()))
    seen = (os.getpid(), os.getuid(), list(self.actions), draws)
    return repr(seen), 0.0, False, False, {}
'''

# Every reset takes seconds: computing (stopped by the process's timer) or
# asleep (stopped by the worker killing the process).
SLOW = '''
class SlowEnv:
  """Takes seconds to reset."""

  def reset(self, seed=None):
    import time
    start = time.time()
    while time.time() - start < 5:
      WAIT
    return "late", {}

  def step(self, action):
    return "", 0.0, True, False, {}
'''


def _seen(result):
  assert result["ok"], result
  return eval(result["obs"])  # pylint: disable=eval-used


def test_episodes_share_a_process_but_not_their_state():
  # One sandbox, so that both programs run in it.
  with SandboxPool("gvisor", 1, preload=("numpy",), warm_spare=False) as pool:
    other = STATEFUL.replace("StatefulEnv", "OtherEnv")
    opened = pool.open_many(
        [{"source": STATEFUL, "seed": s} for s in (1, 2, 3)]
        + [{"source": other, "seed": 4}]
    )
    assert all(o["ok"] for o in opened), opened
    handles = [o["handle"] for o in opened]
    assert pool.stats()[0]["programs"] == 2
    # Interleaved steps: each episode sees only its own actions, and draws
    # from the global generators exactly what it would draw alone.
    first = pool.step_many([(h, f"a{i}") for i, h in enumerate(handles)])
    second = pool.step_many(
        [(h, f"b{i}") for i, h in reversed(list(enumerate(handles)))]
    )[::-1]
    for i, seed in enumerate((1, 2, 3, 4)):
      rng = random.Random(seed)
      np_rng = np.random.RandomState(seed)
      pid1, uid1, actions1, draw1 = _seen(first[i])
      pid2, uid2, actions2, draw2 = _seen(second[i])
      assert (actions1, actions2) == ([f"a{i}"], [f"a{i}", f"b{i}"])
      assert draw1 == (rng.random(), np_rng.random_sample())
      assert draw2 == (rng.random(), np_rng.random_sample())
      assert (pid1, uid1) == (pid2, uid2)
    # One program, one process and uid; another program, another of both.
    ids = [tuple(_seen(r)[:2]) for r in first]
    assert ids[0] == ids[1] == ids[2]
    assert ids[3][0] != ids[0][0] and ids[3][1] != ids[0][1]
    assert min(uid for _, uid in ids) >= 10000
    for h in handles:
      pool.close_env(h)
    assert pool.stats()[0]["programs"] == 0
    assert_pool_works(pool)


def test_a_programs_episodes_stay_in_one_sandbox(gvisor_pool):
  opened = gvisor_pool.open_many(
      [{"source": program(f"p{i % 3}"), "seed": i} for i in range(9)]
  )
  homes = [gvisor_pool.where(o["handle"])["name"] for o in opened]
  for k in range(3):
    assert len({homes[i] for i in range(k, 9, 3)}) == 1
  # A later episode of a running program joins it.
  late = gvisor_pool.create(program("p1"))
  assert gvisor_pool.where(late)["name"] == homes[1]
  assert len(set(homes)) == 2  # three programs spread over both sandboxes
  for h in [o["handle"] for o in opened] + [late]:
    gvisor_pool.close_env(h)
  assert_pool_works(gvisor_pool)


def test_a_crash_ends_only_its_programs_episodes(gvisor_pool):
  crashing = [gvisor_pool.create(program("crashing")) for _ in range(2)]
  healthy = [gvisor_pool.create(program("healthy")) for _ in range(2)]
  for h in crashing + healthy:
    gvisor_pool.reset(h, 0)
  out = gvisor_pool.step_many(
      [
          (healthy[0], "result = 'h0'"),
          (crashing[0], "import os\nos._exit(3)"),
          (crashing[1], "result = 'c1'"),
          (healthy[1], "result = 'h1'"),
      ]
  )
  assert [r["ok"] for r in out] == [True, False, False, True], out
  assert (out[0]["obs"], out[3]["obs"]) == ("h0", "h1")
  # The whole process of the crashing program is gone, each of its
  # episodes gets an error result; a later call too.
  for r in out[1:3]:
    assert r["reason"] == "crash", r
  assert "exited with code 3" in out[1]["message"]
  later = gvisor_pool.step(crashing[1], "result = 1")
  assert later["ok"] is False and later["reason"] == "crash"
  again = gvisor_pool.step_many([(h, "result = 'still'") for h in healthy])
  assert [r["obs"] for r in again] == ["still", "still"]
  # A new episode of the crashed program starts a fresh process.
  fresh = gvisor_pool.create(program("crashing"))
  gvisor_pool.reset(fresh, 0)
  assert gvisor_pool.step(fresh, "result = 'new'")["obs"] == "new"
  for h in crashing + healthy + [fresh]:
    gvisor_pool.close_env(h)
  assert_pool_works(gvisor_pool)


def test_call_timeout_and_output_cap_end_only_that_episode(gvisor_pool):
  same = [gvisor_pool.create(program("budget")) for _ in range(3)]
  other = gvisor_pool.create(program("bystander"))
  for h in same + [other]:
    gvisor_pool.reset(h, 0)
  before = [s["name"] for s in gvisor_pool.stats()]
  out = gvisor_pool.step_many(
      [
          (same[0], "while True:\n  pass"),
          (same[1], "result = 'x' * (1 << 20)"),
          (same[2], "result = 'fine'"),
          (other, "result = 'other'"),
      ]
  )
  # The loop's call budget stopped it; no sandbox was replaced for it.
  assert out[0]["reason"] == "call_timeout", out[0]
  assert f"past its {CALL_TIMEOUT_S} s limit" in out[0]["message"], out[0]
  assert [s["name"] for s in gvisor_pool.stats()] == before
  assert out[1]["reason"] == "output_too_large", out[1]
  assert (out[2]["obs"], out[3]["obs"]) == ("fine", "other")
  # Both episodes are over; their program's process serves the third.
  after = gvisor_pool.step_many([(h, "result = 'next'") for h in same])
  assert [r.get("reason") for r in after[:2]] == [
      "call_timeout",
      "output_too_large",
  ]
  assert after[2]["obs"] == "next"
  for h in same + [other]:
    gvisor_pool.close_env(h)
  assert_pool_works(gvisor_pool)


@pytest.mark.parametrize("wait", ["pass", "time.sleep(1)"])
def test_a_program_that_keeps_timing_out_does_not_stall(gvisor_pool, wait):
  slow = SLOW.replace("WAIT", wait)
  opened = gvisor_pool.open_many(
      [{"source": slow, "seed": s} for s in range(12)]
      + [{"source": program("quick"), "seed": 0}]
  )
  # Twelve resets of 5 s each, over a 0.5 s budget: after two timeouts in
  # a batch the program's other calls are refused (or its process is killed
  # at the first), so the request costs at most two budgets, not sixty
  # seconds: at most two resets ran to their budget, none to its end.
  assert [o["reason"] for o in opened[:12]] == ["call_timeout"] * 12
  ran = [
      o
      for o in opened[:12]
      if o["message"].startswith(("the call ran", "a call ran past"))
  ]
  assert 1 <= len(ran) <= 2, opened[:12]
  for o in opened[:12]:
    assert o in ran or (
        "its other calls in it are refused" in o["message"]
        or "the program's process was killed" in o["message"]
    ), o
  assert opened[12]["ok"] and opened[12]["obs"] == "ready"
  gvisor_pool.close_env(opened[12]["handle"])
  assert sum(s["envs"] for s in gvisor_pool.stats()) == 0
  assert_pool_works(gvisor_pool)


def test_call_many_runs_tool_calls_in_one_request(gvisor_pool):
  opened = gvisor_pool.open_many(
      [{"source": TOOL_USE, "seed": s} for s in (3, 4)]
  )
  handles = [o["handle"] for o in opened]
  out = gvisor_pool.call_many(
      [
          (handles[0], "execute_tool", ["lookup", {"item": "apple"}]),
          (handles[1], "execute_tool", ("lookup", {"item": "pear"})),
          (handles[1], "_state", []),
          (987654, "hint", []),
          (handles[0], "no_such_method", []),
      ]
  )
  price = random.Random(3).randint(1, 9)
  assert out[0]["ok"] and str(price) in str(out[0]["value"]), out[0]
  assert out[1]["ok"] and "4" in str(out[1]["value"]), out[1]
  assert out[2]["ok"] is False and out[2]["reason"] == "exception"
  assert out[3]["ok"] is False and out[3]["reason"] == "closed"
  assert out[4]["ok"] is False and "no_such_method" in out[4]["message"]
  for h in handles:
    gvisor_pool.close_env(h)
  assert_pool_works(gvisor_pool)
