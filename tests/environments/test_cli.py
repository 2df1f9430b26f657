"""The check and play CLIs, run as a user would (python -m ...)."""

import json
import os
import subprocess
import sys

import pytest

from spade.environments import library
from spade.environments import runtime

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")

# name -> (source, expected reason). Hostile files here are all refused by
# the static pass, so they never run even under the trusted "none" backend.
FILES = {
    "good_seed.py": (library.get_program("knapsack").source, "ok"),
    "syntax.py": ("class BrokenEnv(:\n  pass\n", "syntax"),
    "no_class.py": ("x = 1\n", "no_env_class"),
    "escape_os.py": (
        "import os\nclass PwnEnv:\n  def reset(self, seed=None):\n"
        "    return os.popen('id').read(), {}\n",
        "static",
    ),
    "escape_subclasses.py": (
        "class PwnEnv:\n  def reset(self, seed=None):\n"
        "    return str(().__class__.__bases__[0].__subclasses__()), {}\n",
        "static",
    ),
}


def _run(args, stdin=None, timeout=300):
  return subprocess.run(
      [sys.executable, "-m", *args],
      cwd=ROOT,
      input=stdin,
      capture_output=True,
      text=True,
      timeout=timeout,
      check=False,
  )


def _write(tmp_path, files):
  paths = []
  for name, (source, _) in files.items():
    path = tmp_path / name
    path.write_text(source)
    paths.append(str(path))
  return paths


def test_check_json_on_a_mix_of_files(tmp_path):
  paths = _write(tmp_path, FILES)
  paths.insert(2, os.path.join(FIXTURES, "reference_tool_use.py"))
  paths.append(str(tmp_path / "missing.py"))
  proc = _run(
      ["spade.environments.check", "--json", "--backend", "none", *paths]
  )
  assert proc.returncode == 1, proc.stderr
  lines = [json.loads(l) for l in proc.stdout.splitlines()]
  assert [l["file"] for l in lines] == paths
  got = {os.path.basename(l["file"]): l["reason"] for l in lines}
  want = {name: reason for name, (_, reason) in FILES.items()}
  want["reference_tool_use.py"] = "ok"
  want["missing.py"] = "unreadable"
  assert got == want
  for line in lines:
    assert set(line) >= {"file", "valid", "reason", "message"}
    assert line["valid"] == (line["reason"] == "ok")


def test_check_text_output_and_success_status(tmp_path):
  good = {"a.py": FILES["good_seed.py"]}
  proc = _run(
      ["spade.environments.check", "--backend", "none", *_write(tmp_path, good)]
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.strip().endswith(
      "ok KnapsackEnv (hint) (solution wins" " in 8 steps)"
  )


def test_check_usage_error():
  proc = _run(["spade.environments.check"])
  assert proc.returncode == 2 and "FILE" in proc.stderr


def test_play_reads_actions_from_stdin(tmp_path):
  program = library.get_program("tower_of_hanoi")
  path = tmp_path / "hanoi.py"
  path.write_text(program.source)
  env = runtime.load_program(program.source)()
  env.reset(seed=4)
  actions = ["not a move", ":hint"] + env.solution()
  proc = _run(
      [
          "spade.environments.play",
          str(path),
          "--seed",
          "4",
          "--show-hint",
          "--backend",
          "none",
      ],
      stdin="\n".join(actions) + "\n",
  )
  assert proc.returncode == 0, proc.stderr
  out = proc.stdout
  assert out.startswith("Tower of Hanoi.")
  assert out.count("[hint] Move the top") == 2
  assert "Reply like \\boxed{A C}." in out
  assert out.rstrip().endswith("[episode won]")
  assert "[reward +1.00  total +1.00]" in out


@pytest.mark.sandbox
def test_check_in_gvisor_with_hostile_programs_that_run(tmp_path):
  files = dict(FILES)
  files["c_loop.py"] = (
      "import itertools\nclass SpinEnv:\n  def reset(self, seed=None):\n"
      "    return str(sum(itertools.repeat(1))), {}\n",
      "timeout",
  )
  files["memory_bomb.py"] = (
      "class HogEnv:\n  def reset(self, seed=None):\n"
      "    return str(len(bytearray(1 << 36))), {}\n",
      "reset",
  )
  paths = _write(tmp_path, files)
  proc = _run(["spade.environments.check", "--json", "--timeout", "6", *paths])
  assert proc.returncode == 1, proc.stderr
  got = {
      os.path.basename(l["file"]): l["reason"]
      for l in map(json.loads, proc.stdout.splitlines())
  }
  assert got == {name: reason for name, (_, reason) in files.items()}
