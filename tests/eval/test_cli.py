"""`python -m spade.eval` from a fresh workdir, one subprocess per suite.

Each run uses the tiny config (a random byte model: scores near 0 are
expected) with --num_examples=8 and must end stdout with the JSON summary.
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def _run_cli(workdir, *args, path=None):
  env = dict(os.environ)
  if path is not None:
    env["PATH"] = path
  # One CPU device is enough for the CLI; the fake 8 are for sharding tests.
  env["XLA_FLAGS"] = os.environ.get("SPADE_TEST_XLA_FLAGS", "")
  proc = subprocess.run(
      [
          sys.executable,
          "-m",
          "spade.eval",
          "--config=configs/tiny.py",
          f"--workdir={workdir}",
          *args,
      ],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=900,
      check=False,
  )
  return proc


def _check_summary(proc, suite, workdir):
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = proc.stdout.strip().splitlines()
  summary = json.loads(lines[-1])
  assert summary["suite"] == suite
  assert summary["num_examples"] == 8
  assert 0.0 <= summary["score"] <= 1.0
  assert summary["weights"] == "initial weights (scratch)"
  item_lines = [
      l for l in lines if l.startswith(f"[{suite}] ") and "score=" in l
  ]
  assert len(item_lines) == 8
  with open(os.path.join(workdir, "eval", f"{suite}.jsonl")) as f:
    records = [json.loads(line) for line in f]
  assert len(records) == 8
  mean = sum(r["score"] for r in records) / 8
  assert summary["score"] == pytest.approx(mean)
  return summary


@pytest.mark.slow
def test_cli_reasoning_gym(tmp_path):
  workdir = str(tmp_path / "w")
  proc = _run_cli(workdir, "--suite=reasoning_gym", "--num_examples=8")
  summary = _check_summary(proc, "reasoning_gym", workdir)
  assert len(summary["categories"]) == 8


@pytest.mark.slow
def test_cli_tool_use(tmp_path):
  workdir = str(tmp_path / "w")
  proc = _run_cli(workdir, "--suite=tool_use", "--num_examples=8")
  summary = _check_summary(proc, "tool_use", workdir)
  assert summary["source"] in ("bfcl_v4", "spade_heldout")


@pytest.mark.slow
@pytest.mark.sandbox
def test_cli_humaneval(tmp_path):
  workdir = str(tmp_path / "w")
  proc = _run_cli(workdir, "--suite=humaneval", "--num_examples=8")
  _check_summary(proc, "humaneval", workdir)


@pytest.mark.slow
@pytest.mark.sandbox
def test_cli_seed_heldout(tmp_path):
  workdir = str(tmp_path / "w")
  proc = _run_cli(workdir, "--suite=seed_heldout", "--num_examples=8")
  summary = _check_summary(proc, "seed_heldout", workdir)
  assert summary["environments"]


def test_cli_rejects_unknown_suite(tmp_path):
  proc = _run_cli(str(tmp_path), "--suite=mmlu")
  assert proc.returncode != 0
  assert "mmlu" in proc.stderr and "reasoning_gym" in proc.stderr


def test_cli_rejects_zero_examples(tmp_path):
  proc = _run_cli(str(tmp_path), "--suite=tool_use", "--num_examples=0")
  assert proc.returncode == 2
  assert "--num_examples=0 must be >= 1" in proc.stderr


def test_cli_without_runsc_says_what_to_install(tmp_path):
  # No runsc on PATH: the sandboxed suites stop with one clear line.
  proc = _run_cli(
      str(tmp_path),
      "--suite=humaneval",
      "--num_examples=1",
      path="/nonexistent",
  )
  assert proc.returncode == 2
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith("spade.eval: error: sandbox:"), proc.stderr[-2000:]
  assert "runsc" in last
