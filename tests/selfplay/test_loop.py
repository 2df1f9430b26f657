"""The self-play loop end to end on the tiny config: metrics, resume, kill -9."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from spade.selfplay import metrics as metrics_lib

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
REQUIRED = (
    "designer/valid_rate",
    "regret/mean",
    "designer/reward_mean",
    "agent/return_hint",
    "agent/return_nohint",
    "agent/episode_length_mean",
    "tokens/sampled",
    "time/sampling_s",
    "time/sandbox_s",
    "time/update_s",
    "designer/diversity",
    "memory/size",
    "memory/duplicates_rejected",
    "memory/replay_fraction",
    "train/rows_with_signal",
    "train/rows_total",
)


def _main(workdir, iterations, **kwargs):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)  # one CPU device, like a user's first run
  return subprocess.Popen(
      [
          sys.executable,
          "-m",
          "spade.main",
          "--config=configs/tiny.py:smoke",
          f"--config.num_iterations={iterations}",
          f"--workdir={workdir}",
      ],
      cwd=ROOT,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
      **kwargs,
  )


@pytest.mark.sandbox
@pytest.mark.slow
def test_run_kill_and_resume(tmp_path):
  workdir = str(tmp_path / "w")
  # Run 3 iterations but kill -9 once the first checkpoint is complete.
  proc = _main(workdir, 3)
  ckpt = os.path.join(workdir, "checkpoints", "1")
  deadline = time.time() + 600
  while not os.path.isdir(ckpt) and proc.poll() is None:
    assert time.time() < deadline, "no checkpoint after 10 minutes"
    time.sleep(0.5)
  out = ""
  if proc.poll() is None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  else:
    out = proc.stdout.read()
  assert os.path.isdir(ckpt), out[-3000:]
  rows = metrics_lib.read_metrics(workdir)
  assert rows and rows[0]["step"] == 1
  for key in REQUIRED:
    assert key in rows[0], key

  # Starting again resumes after the last checkpoint and finishes.
  proc = _main(workdir, 2)
  out, _ = proc.communicate(timeout=900)
  assert proc.returncode == 0, out[-3000:]
  assert "resumed from" in out
  rows = metrics_lib.read_metrics(workdir)
  assert [r["step"] for r in rows] == [1, 2]
  # Each iteration's programs and verdicts are on disk.
  for it in (0, 1):
    folder = os.path.join(workdir, "programs", f"iter_{it:06d}")
    with open(os.path.join(folder, "verdicts.json")) as f:
      verdicts = json.load(f)
    assert verdicts["designs"] and "reason" in verdicts["designs"][0]["verdict"]
    assert verdicts["played"]
  assert os.path.exists(os.path.join(workdir, "memory.json"))


@pytest.mark.sandbox
@pytest.mark.slow
def test_fixed_pool_baseline_with_warm_start(tmp_path):
  """The baseline: no designer, seed environments only, after a warm start."""
  workdir = str(tmp_path / "fp")
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  proc = subprocess.run(
      [
          sys.executable,
          "-m",
          "spade.main",
          "--config=configs/tiny.py:smoke",
          "--config.train.mode=fixed_pool",
          "--config.train.warm_start_steps=2",
          f"--workdir={workdir}",
      ],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=900,
      check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "warm start 2/2" in proc.stderr
  (row,) = metrics_lib.read_metrics(workdir)
  assert row["designer/num_designs"] == 0.0
  assert row["agent/seed_envs"] == row["agent/num_envs"] == 1.0
  assert row["agent/episodes"] == 2.0  # K=1 without and K=1 with the hint
  assert row["update/designer_rows"] == 0.0 and row["update/agent_rows"] > 0
