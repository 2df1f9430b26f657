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


def _main(workdir, iterations, extra=(), **kwargs):
  """Starts a run; its output goes to WORKDIR.log (a pipe nobody reads
  while the run goes on would fill and stall it)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  # One CPU device, like a user's first run.
  env["XLA_FLAGS"] = os.environ.get("SPADE_TEST_XLA_FLAGS", "")
  return subprocess.Popen(
      [
          sys.executable,
          "-m",
          "spade.main",
          "--config=configs/tiny.py:smoke",
          f"--config.num_iterations={iterations}",
          f"--workdir={workdir}",
          *extra,
      ],
      cwd=ROOT,
      env=env,
      stdout=open(workdir + ".log", "w"),  # pylint: disable=consider-using-with
      stderr=subprocess.STDOUT,
      text=True,
      **kwargs,
  )


def _finish(proc, workdir, timeout=900):
  """Waits for a run; returns (exit code, its output)."""
  proc.wait(timeout=timeout)
  with open(workdir + ".log") as f:
    return proc.returncode, f.read()


def _comparable(rows):
  """Metrics without wall-clock figures: what a resume must reproduce."""
  return [
      {k: v for k, v in r.items() if not k.startswith("time/")} for r in rows
  ]


def _untimed(x):
  """A verdict file's JSON without its wall-clock fields (`*_s`)."""
  if isinstance(x, dict):
    return {k: _untimed(v) for k, v in x.items() if not k.endswith("_s")}
  if isinstance(x, list):
    return [_untimed(v) for v in x]
  return x


def _programs(workdir):
  """Every saved program and verdict file of a run, by relative path."""
  root = os.path.join(workdir, "programs")
  out = {}
  for folder, _, files in os.walk(root):
    for name in files:
      path = os.path.join(folder, name)
      with open(path) as f:
        text = f.read()
      out[os.path.relpath(path, root)] = (
          _untimed(json.loads(text)) if name.endswith(".json") else text
      )
  return out


@pytest.mark.sandbox
@pytest.mark.slow
def test_kill_and_resume_reproduces_the_uninterrupted_run(tmp_path):
  """kill -9 after the third checkpoint, resume: same metrics and programs.

  With `optim.designer_delay=2` the delayed designer rows must come back
  from the checkpoint, and the killed run's sandboxes must be gone.
  """
  import psutil  # pylint: disable=g-import-not-at-top

  delay = ["--config.optim.designer_delay=2"]
  workdir = str(tmp_path / "killed")
  proc = _main(workdir, 4, extra=delay)
  ckpt = os.path.join(workdir, "checkpoints", "3")
  deadline = time.time() + 900
  while not os.path.isdir(ckpt) and proc.poll() is None:
    assert time.time() < deadline, "no third checkpoint after 15 minutes"
    time.sleep(0.2)
  out = ""
  if proc.poll() is None:
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  else:
    children = []
    _, out = _finish(proc, workdir)
  assert os.path.isdir(ckpt), out[-3000:]
  rows = metrics_lib.read_metrics(workdir)
  assert rows and rows[0]["step"] == 1
  for key in REQUIRED:
    assert key in rows[0], key
  # The designer's and the agent's prompts went through the slot servers.
  assert rows[0]["tokens/prefill"] > 0

  # Starting again resumes after the last checkpoint and finishes.
  code, out = _finish(_main(workdir, 4, extra=delay), workdir)
  assert code == 0, out[-3000:]
  assert "resumed from" in out
  # No sandbox or environment process of the killed run is left.
  left = [p for p in children if p.is_running() and p.status() != "zombie"]
  assert not left, [p.cmdline() for p in left]

  reference = str(tmp_path / "uninterrupted")
  code, ref_out = _finish(_main(reference, 4, extra=delay), reference)
  assert code == 0, ref_out[-3000:]
  resumed = metrics_lib.read_metrics(workdir)
  assert [r["step"] for r in resumed] == [1, 2, 3, 4]
  assert _comparable(resumed) == _comparable(
      metrics_lib.read_metrics(reference)
  )
  assert _programs(workdir) == _programs(reference)
  for it in range(4):
    folder = os.path.join(workdir, "programs", f"iter_{it:06d}")
    with open(os.path.join(folder, "verdicts.json")) as f:
      verdicts = json.load(f)
    # The pool is designed at iteration 0 and played for its window (4).
    if it == 0:
      assert "reason" in verdicts["designs"][0]["verdict"]
    else:
      assert verdicts["designs"] == []
    assert verdicts["played"]
  assert os.path.exists(os.path.join(workdir, "memory.json"))


@pytest.mark.sandbox
@pytest.mark.slow
def test_fixed_pool_baseline_with_warm_start(tmp_path):
  """The baseline: no designer, seed environments only, after a warm start."""
  workdir = str(tmp_path / "fp")
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env["XLA_FLAGS"] = os.environ.get("SPADE_TEST_XLA_FLAGS", "")
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
  assert "warm start: 2 steps in" in proc.stderr
  (row,) = metrics_lib.read_metrics(workdir)
  assert row["designer/num_designs"] == 0.0
  assert row["agent/seed_envs"] == row["agent/num_envs"] == 1.0
  assert row["agent/episodes"] == 2.0  # K=1 without and K=1 with the hint
  # The agent's prompts went through the slot servers and are counted;
  # what came from a cache is a part of them.
  assert row["tokens/prefill"] > row["tokens/prefill_saved"] >= 0
  assert row["tokens/prefill_saved"] >= row["tokens/carried"] >= 0
  # One unhinted episode per environment has no one to be compared with:
  # no row carries signal and the update is skipped, saying so.
  assert row["train/rows_total"] > 0 and row["train/rows_with_signal"] == 0
  assert row["train/update_skipped"] == 1.0
  # Every episode's transcript: the seed's name, each turn's action and
  # answer, and the return the update used.
  path = os.path.join(workdir, "programs", "iter_000000", "episodes.jsonl")
  with open(path) as f:
    episodes = [json.loads(line) for line in f]
  assert len(episodes) == 2
  assert sorted(e["hinted"] for e in episodes) == [False, True]
  for e in episodes:
    assert e["name"] and e["first_observation"]
    assert e["turns"] and all("action" in t for t in e["turns"])
    assert e["return"] in (0.0, 1.0) and not e["env_failed"]
