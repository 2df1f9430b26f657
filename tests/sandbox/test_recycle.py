"""Sandbox life cycle: recycling with a warm spare, lost sandboxes, cleanup."""

import os
import signal
import subprocess
import time

import pytest

from spade.sandbox import SandboxError
from spade.sandbox import SandboxPool
from spade.sandbox import runsc
from tests.sandbox.conftest import PROBE
from tests.sandbox.conftest import assert_pool_works
from tests.sandbox.conftest import host_processes
from tests.sandbox.conftest import program

pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module")
def small_pool():
  """One bare gVisor sandbox (no preloads: starts in about a second)."""
  with SandboxPool(
      "gvisor",
      1,
      step_timeout_s=2.0,
      host_grace_s=1.0,
      max_envs_per_sandbox=3,
      preload=(),
  ) as pool:
    yield pool


def _wait_for_spare(pool, timeout_s=60.0):
  deadline = time.monotonic() + timeout_s
  while pool._spare is None and time.monotonic() < deadline:  # pylint: disable=protected-access
    time.sleep(0.05)
  assert pool._spare is not None  # pylint: disable=protected-access


def test_recycled_after_n_children_with_warm_spare(small_pool):
  pool = small_pool
  _wait_for_spare(pool)
  first = pool.stats()[0]
  spare_name = pool._spare.name  # pylint: disable=protected-access
  keep = pool.create(program("keep"))
  pool.reset(keep, 0)
  # More episodes of a running program start no process: no wear.
  pool.close_env(pool.create(program("keep")))
  pool.close_env(pool.create(program("second")))
  assert pool.stats()[0]["name"] == first["name"]
  third = pool.create(program("third"))  # the third process wears it out
  now = pool.stats()[0]
  assert now["name"] == spare_name != first["name"]
  # Environments on the retired sandbox keep working until closed.
  assert pool.step(keep, "result = 'still here'")["obs"] == "still here"
  assert pool.step(third, "result = 3")["obs"] == "3"
  pool.close_env(keep)
  pool.close_env(third)
  # The retired sandbox is destroyed once empty; its host process goes.
  assert runsc.wait_gone(first["host_pid"], 30.0)
  fresh = pool.create(PROBE)
  pool.reset(fresh, 0)
  assert pool.stats()[0]["name"] == spare_name
  pool.close_env(fresh)
  assert_pool_works(pool)


def test_killed_sandbox_is_replaced_and_its_envs_reported(small_pool):
  pool = small_pool
  h = pool.create(PROBE)
  pool.reset(h, 0)
  victim = pool.where(h)
  os.kill(victim["host_pid"], signal.SIGKILL)
  out = pool.step(h, "result = 1")
  assert out["ok"] is False and out["reason"] == "sandbox_lost", out
  with pytest.raises(SandboxError) as e:
    pool.reset(h, 0)
  assert e.value.reason == "sandbox_lost"
  pool.close_env(h)
  assert victim["name"] not in [s["name"] for s in pool.stats()]
  assert_pool_works(pool)


def test_host_deadline_replaces_a_stalled_sandbox(small_pool):
  pool = small_pool
  h = pool.create(PROBE)
  pool.reset(h, 0)
  victim = pool.where(h)
  # A paused sandbox cannot enforce the worker's deadline: the host must.
  subprocess.run(
      [pool.runsc, f"--root={pool.state_root}", "pause", victim["name"]],
      check=True,
      capture_output=True,
  )
  out = pool.step(h, "result = 1")
  # Lost to the host's deadline, not to an exit of the worker.
  assert out["ok"] is False and out["reason"] == "sandbox_lost", out
  assert "missed the host deadline" in out["message"], out
  assert runsc.wait_gone(victim["host_pid"], 30.0)
  pool.close_env(h)
  assert_pool_works(pool)


def test_close_leaves_nothing_behind():
  pool = SandboxPool("gvisor", 2, preload=(), warm_spare=True)
  tmpdir = pool.tmpdir
  handles = [pool.create(PROBE) for _ in range(3)]
  for h in handles:
    pool.reset(h, 0)
  assert host_processes(tmpdir)
  pool.close()
  pool.close()  # idempotent
  assert not os.path.exists(tmpdir)
  deadline = time.monotonic() + 10
  while host_processes(tmpdir) and time.monotonic() < deadline:
    time.sleep(0.1)
  assert host_processes(tmpdir) == []
  with pytest.raises(SandboxError) as e:
    pool.create(PROBE)
  assert e.value.reason == "closed"
