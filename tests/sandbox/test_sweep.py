"""After `kill -9` of a trainer, the next pool removes what it left behind."""

import json
import logging
import os
import select
import signal
import subprocess
import sys

import pytest

from spade.sandbox import SandboxPool
from spade.sandbox import runsc
from spade.sandbox.sweep import sweep_orphans
from tests.sandbox.conftest import PROBE
from tests.sandbox.conftest import assert_pool_works

pytestmark = pytest.mark.sandbox

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))

# A trainer stand-in: a pool with live episodes, reporting where it lives,
# then waiting to be killed.
_TRAINER = """
import json, sys, time
sys.path.insert(0, {root!r})
from spade.sandbox import SandboxPool
pool = SandboxPool("gvisor", 2, preload=(), warm_spare=True)
handles = [pool.create({probe!r}) for _ in range(3)]
for h in handles:
  pool.reset(h, 0)
while pool._spare is None:
  time.sleep(0.05)
print(json.dumps({{
    "tmpdir": pool.tmpdir,
    "state_root": pool.state_root,
    "names": [s.name for s in pool._sandboxes] + [pool._spare.name],
    "pids": [s.pid for s in pool._sandboxes] + [pool._spare.pid],
}}), flush=True)
time.sleep(600)
"""


def _runsc_list(state_root):
  out = subprocess.run(
      [runsc.find_runsc(), f"--root={state_root}", "list"],
      capture_output=True,
      text=True,
      check=False,
  )
  return out.stdout


def _start_trainer():
  proc = subprocess.Popen(
      [sys.executable, "-c", _TRAINER.format(root=_ROOT, probe=PROBE)],
      stdout=subprocess.PIPE,
      text=True,
  )
  ready, _, _ = select.select([proc.stdout], [], [], 180)
  assert ready, "the trainer's pool did not start"
  return proc, json.loads(proc.stdout.readline())


def test_a_killed_trainers_sandboxes_are_swept_on_start(caplog):
  live = SandboxPool("gvisor", 1, preload=(), warm_spare=False)
  trainer, seen = _start_trainer()
  os.kill(trainer.pid, signal.SIGKILL)
  trainer.wait()
  # What the killed trainer left: its directory and its containers.
  assert os.path.isdir(seen["tmpdir"])
  listed = _runsc_list(seen["state_root"])
  assert all(name in listed for name in seen["names"]), listed
  with caplog.at_level(logging.INFO, logger="spade.sandbox.sweep"):
    pool = SandboxPool("gvisor", 1, preload=(), warm_spare=False)
  try:
    assert pool.swept["directories"] >= 1
    assert pool.swept["sandboxes"] >= len(seen["names"])
    assert "left by dead trainers" in caplog.text
    assert not os.path.exists(seen["tmpdir"])
    for pid in seen["pids"]:
      assert runsc.wait_gone(pid, 10.0), pid
    assert runsc.processes_naming(seen["tmpdir"]) == []
    listed = _runsc_list(seen["state_root"])
    assert not any(name in listed for name in seen["names"]), listed
    # A live pool's sandboxes are left alone.
    assert os.path.isdir(live.tmpdir)
    assert_pool_works(live)
    assert_pool_works(pool)
  finally:
    pool.close()
    live.close()


def test_a_reused_pid_does_not_keep_a_dead_owner_alive(tmp_path):
  # The owner file names this process's pid with another start time: the
  # process that wrote it is gone, although the pid runs.
  stale = tmp_path / "spade-sandbox-stale0"
  (stale / "sb0").mkdir(parents=True)
  (stale / "owner.json").write_text(
      json.dumps({"pid": os.getpid(), "start": "1"})
  )
  alive = tmp_path / "spade-sandbox-alive0"
  alive.mkdir()
  (alive / "owner.json").write_text(
      json.dumps({"pid": os.getpid(), "start": runsc.start_time(os.getpid())})
  )
  unowned = tmp_path / "spade-sandbox-unowned"
  unowned.mkdir()
  removed = sweep_orphans(str(tmp_path))
  assert removed == {"sandboxes": 1, "processes": 0, "directories": 1}
  assert not stale.exists() and alive.exists() and unowned.exists()
