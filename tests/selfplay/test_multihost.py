"""One process with 8 devices and two with 4 each give the same iteration.

Runs `spade.main` on `configs/tiny.py:smoke` (fixed seed, same global batch)
as one process with 8 fake CPU devices, then as two processes with 4 fake
devices each that find each other over localhost through JAX's own runtime
(`jax.distributed.initialize`, gloo collectives on CPU). The metrics.jsonl of
both runs must agree (numbers within a float tolerance; `time/*` excluded)
and so must the programs the designer wrote.
"""

import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
CONFIG = "configs/tiny.py:smoke"
TIMEOUT_S = 600  # per run; one iteration takes ~2.5 min on 2 busy cores
# Cross-process all-reduces may sum in another order than on one host.
RTOL, ATOL = 1e-4, 1e-5


def _env(devices: int) -> dict:
  env = dict(os.environ)
  env["JAX_PLATFORMS"] = "cpu"
  # Replaces conftest's 8-device flag: each process gets `devices`.
  env["XLA_FLAGS"] = " ".join(
      [
          os.environ.get("SPADE_TEST_XLA_FLAGS", ""),
          f"--xla_force_host_platform_device_count={devices}",
      ]
  ).strip()
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  # A hung run is stopped with SIGABRT, so its log shows where it hung.
  env["PYTHONFAULTHANDLER"] = "1"
  return env


def _command(workdir: str, *extra: str) -> list[str]:
  return [
      sys.executable,
      "-m",
      "spade.main",
      f"--config={CONFIG}",
      f"--workdir={workdir}",
      *extra,
  ]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _run(procs: list[tuple[list[str], dict, str]]) -> None:
  """Starts every command at once; fails with their logs if any fails."""
  running = []
  for cmd, env, log in procs:
    with open(log, "w") as f:
      running.append(
          subprocess.Popen(
              cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT
          )
      )
  deadline = time.monotonic() + TIMEOUT_S
  codes = []
  try:
    for p in running:
      try:
        codes.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
      except subprocess.TimeoutExpired:
        codes.append(None)
  finally:
    for p in running:
      if p.poll() is None:
        p.send_signal(signal.SIGABRT)  # faulthandler prints every stack
        try:
          p.wait(timeout=20)
        except subprocess.TimeoutExpired:
          p.kill()
          p.wait()
  if any(code != 0 for code in codes):
    tails = []
    for (_, _, log), code in zip(procs, codes):
      with open(log) as f:
        # Drop absl INFO lines and gloo chatter; keep errors and stacks.
        lines = [
            line
            for line in f.read().splitlines()
            if not re.match(r"I\d{4} |\[Gloo\]", line)
        ]
      status = "timed out" if code is None else f"exit {code}"
      tails.append(f"--- {log} ({status}):\n" + "\n".join(lines[-80:]))
    pytest.fail("a run failed:\n" + "\n".join(tails))


def _metrics(workdir: str) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if line.strip()]


def _programs(workdir: str) -> dict[str, str]:
  out = {}
  base = os.path.join(workdir, "programs")
  for folder, _, files in os.walk(base):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(folder, name)
        with open(path) as f:
          out[os.path.relpath(path, base)] = f.read()
  return out


def metric_differences(one: list[dict], two: list[dict]) -> list[str]:
  """Describes every way two metrics.jsonl row lists differ (timing aside)."""
  diffs = []
  if len(one) != len(two):
    diffs.append(f"{len(one)} rows vs {len(two)} rows")
  for a, b in zip(one, two):
    keys_a = {k for k in a if not k.startswith("time/")}
    keys_b = {k for k in b if not k.startswith("time/")}
    for k in sorted(keys_a ^ keys_b):
      diffs.append(f"step {a.get('step')}: {k} only in one run")
    for k in sorted(keys_a & keys_b):
      x, y = a[k], b[k]
      if isinstance(x, (int, float)) and isinstance(y, (int, float)):
        if not math.isclose(x, y, rel_tol=RTOL, abs_tol=ATOL):
          diffs.append(f"step {a['step']}: {k} {x!r} vs {y!r}")
      elif x != y:
        diffs.append(f"step {a['step']}: {k} {x!r} vs {y!r}")
  return diffs


def test_metric_differences_sees_real_differences():
  a = [{"step": 1, "regret/mean": 0.5, "time/iteration_s": 3.0, "x/n": 2.0}]
  b = [{"step": 1, "regret/mean": 0.5 + 1e-9, "time/iteration_s": 9.0}]
  assert metric_differences(a, b) == ["step 1: x/n only in one run"]
  b[0]["x/n"] = 2.5
  assert metric_differences(a, b) == ["step 1: x/n 2.0 vs 2.5"]
  assert metric_differences(a, []) == ["1 rows vs 0 rows"]


@pytest.mark.slow
def test_one_process_equals_two_processes(tmp_path):
  one = str(tmp_path / "one")
  two = str(tmp_path / "two")
  _run([(_command(one), _env(8), str(tmp_path / "one.log"))])
  port = _free_port()
  _run(
      [
          (
              _command(
                  two,
                  f"--coordinator_address=127.0.0.1:{port}",
                  "--num_processes=2",
                  f"--process_id={i}",
              ),
              _env(4),
              str(tmp_path / f"two_{i}.log"),
          )
          for i in range(2)
      ]
  )
  rows_one, rows_two = _metrics(one), _metrics(two)
  assert len(rows_one) == 1 and rows_one[0]["step"] == 1
  # The smoke run plays at least one environment with and without a hint.
  assert rows_one[0]["agent/episodes"] >= 2
  diffs = metric_differences(rows_one, rows_two)
  assert not diffs, "1x8 and 2x4 devices differ:\n" + "\n".join(diffs)
  assert _programs(one) == _programs(two)
