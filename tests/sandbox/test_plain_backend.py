"""The worker's protocol on the "none" backend, so it is tested without runsc.

No isolation here (trusted code only): these tests check deadlines, crash
reports, batching and program runs, which behave the same in every backend.
"""

import pytest

from spade.sandbox import SandboxPool
from tests.sandbox.conftest import PROBE
from tests.sandbox.conftest import assert_pool_works
from tests.sandbox.conftest import probe
from tests.sandbox.conftest import program


@pytest.fixture(scope="module")
def plain_pool():
  with SandboxPool(
      "none", 2, step_timeout_s=1.0, preload=(), warm_spare=False
  ) as pool:
    yield pool


def test_batches_deadlines_and_crashes(plain_pool):
  # Three programs: a crash ends only the episodes of its own program.
  handles = [plain_pool.create(program(i), {"tag": i}) for i in range(3)]
  infos = [plain_pool.reset(h, 5)[1] for h in handles]
  assert infos == [{"seed": 5, "kwargs": {"tag": i}} for i in range(3)]
  out = plain_pool.step_many(
      [
          (handles[0], "while True:\n  pass"),
          (handles[1], "import os\nos._exit(7)"),
          (handles[2], "result = 'fine'"),
      ]
  )
  # The per-call budget (0.5 s by default) ends the loop's episode, not the
  # host's deadline on the whole request ("sandbox_lost").
  assert out[0]["reason"] == "call_timeout", out[0]
  budget = plain_pool.options.call_timeout_s
  assert f"past its {budget} s limit" in out[0]["message"], out[0]
  assert out[1]["reason"] == "crash" and "code 7" in out[1]["message"]
  assert out[2] == {
      "ok": True,
      "obs": "fine",
      "reward": 0.0,
      "terminated": False,
      "truncated": False,
      "info": {},
  }
  assert plain_pool.call(handles[2], "hint") == "read the source"
  for h in handles:
    plain_pool.close_env(h)
  assert plain_pool.num_envs == 0
  assert [s["envs"] for s in plain_pool.stats()] == [0, 0]
  assert_pool_works(plain_pool)


def test_results_are_capped_and_checked(plain_pool):
  huge, out = probe(plain_pool, "result = 'x' * (2 << 20)", keep=True)
  assert out["ok"] is False and out["reason"] == "output_too_large"
  # An oversized result ends the episode.
  again = plain_pool.step(huge, "result = 1")
  assert again["ok"] is False and again["reason"] == "output_too_large"
  plain_pool.close_env(huge)
  bad = plain_pool.create(
      PROBE.replace("return str(scope.get", "return (scope.get")
  )
  plain_pool.reset(bad, 0)
  out = plain_pool.step(bad, "result = 1")
  # step() returned an int observation: refused with a message, not passed on.
  assert out["ok"] is False and "observation must be str" in out["message"]
  plain_pool.close_env(bad)
  assert_pool_works(plain_pool)


def test_run_code_outcomes(plain_pool):
  ok = plain_pool.run_code("print(sum(range(10)))", 5.0)
  assert (ok["ok"], ok["exit_code"], ok["stdout"]) == (True, 0, "45\n")
  raised = plain_pool.run_code("raise KeyError('k')", 5.0)
  assert raised["exit_code"] == 1 and "KeyError: 'k'" in raised["stderr"]
  exited = plain_pool.run_code("import sys\nsys.exit(4)", 5.0)
  assert (exited["ok"], exited["exit_code"], exited["reason"]) == (
      False,
      4,
      "exit",
  )
  hung = plain_pool.run_code("import time\ntime.sleep(60)", 0.5)
  assert hung["reason"] == "timeout" and hung["exit_code"] is None
