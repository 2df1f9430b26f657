"""The check and play CLIs, run as a user would (python -m ...)."""

import glob
import json
import os
import subprocess
import sys

import pytest

from spade.environments import contract
from spade.environments import library
from spade.environments import runtime

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
# Every complete environment program in the reference's prompt templates
# (verbatim), and one program per acceptance rule written for the tests.
# The prompt's interface skeleton, which the reference refuses as well.
SKELETON = os.path.join(
    FIXTURES, "reference_prompts", "skeleton_descriptive_name_env.py.txt"
)
ACCEPTED = sorted(
    set(glob.glob(os.path.join(FIXTURES, "reference_prompts", "*.py.txt")))
    - {SKELETON}
    | set(glob.glob(os.path.join(FIXTURES, "variants", "*.py")))
)

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
    if line["valid"]:
      assert set(line["properties"]) == set(contract.PROPERTIES)
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


def _check_json(paths, *flags):
  # A generous deadline: the machine running the tests may be loaded.
  proc = _run(
      ["spade.environments.check", "--json", "--timeout", "120", *flags, *paths]
  )
  return proc, [json.loads(l) for l in proc.stdout.splitlines()]


def test_check_accepts_the_reference_prompt_programs_and_rule_variants():
  assert len(ACCEPTED) == 3 + 8
  proc, lines = _check_json(ACCEPTED + [SKELETON], "--backend", "none")
  assert proc.returncode == 1, proc.stderr
  by_name = {os.path.basename(l["file"]): l for l in lines}
  assert by_name.pop(os.path.basename(SKELETON))["reason"] == "init"
  assert {n: l["reason"] for n, l in by_name.items()} == dict.fromkeys(
      by_name, "ok"
  )
  lacking = {
      n: {p for p, ok in l["properties"].items() if not ok}
      for n, l in by_name.items()
  }
  # Each rule variant lacks the property its rule is about (if any).
  assert "deterministic" in lacking["unseeded_random.py"]
  assert "rewards_in_unit" in lacking["penalty_below_minus_one.py"]
  assert "robust" in lacking["step_raises_on_other_replies.py"]
  assert "solution_replayed" in lacking["bare_move_solution.py"]
  assert lacking["long_tool_chain.py"] == set()
  assert by_name["long_tool_chain.py"]["solution_tool_calls"] == 15
  assert by_name["helper_class_named_env.py"]["class_name"] == "LanternEnv"
  proc, _ = _check_json(ACCEPTED, "--backend", "none")
  assert proc.returncode == 0, proc.stdout


def test_check_require_refuses_what_lacks_a_property():
  path = os.path.join(FIXTURES, "variants", "unseeded_random.py")
  proc, lines = _check_json(
      [path], "--backend", "none", "--require", "deterministic"
  )
  assert proc.returncode == 1
  assert lines[0]["reason"] == "requires_deterministic"


# Its first reset() takes ~1-2 s of CPU: inside the loop's (the reference's)
# 30 s budget of a call, over the strict 0.5 s.
SLOW_FIRST_RESET = """
FIRST = [True]


class SlowStartEnv:
  def __init__(self):
    self.max_turns = 3
    self.turn_count = 0

  def reset(self, seed=None):
    if FIRST[0]:
      FIRST[0] = False
      sum(i * i for i in range(15_000_000))
    self.turn_count = 0
    return "Say anything.", {}

  def step(self, action):
    self.turn_count += 1
    return "Done.", 1.0, True, False, {}
"""


def test_check_budgets_are_the_loops(tmp_path):
  path = tmp_path / "slow_start.py"
  path.write_text(SLOW_FIRST_RESET)
  proc, lines = _check_json([str(path)], "--backend", "none")
  assert proc.returncode == 0 and lines[0]["valid"], proc.stdout + proc.stderr
  proc, lines = _check_json(
      [str(path)], "--backend", "none", "--budgets", "strict"
  )
  assert proc.returncode == 1 and lines[0]["reason"] == "call_timeout", lines


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
  # The hint comes before the first observation, as a hinted episode sees it.
  assert out.startswith("[hint] Move the top")
  assert out.splitlines()[1].startswith("Tower of Hanoi.")
  assert out.count("[hint] Move the top") == 2
  assert "Reply like \\boxed{A C}." in out
  assert out.rstrip().endswith("[episode won]")
  assert "[reward +1.00  total +1.00]" in out


def test_play_shows_a_runs_written_hint_by_archive_id_or_file(tmp_path):
  program = library.get_program("tower_of_hanoi")
  path = tmp_path / "design_000.py"
  path.write_text(program.source)
  memory = {
      "entries": [
          {"id": "env-000001", "code": "class OtherEnv: pass\n",
           "verdict": {"class_name": "OtherEnv"}},
          {"id": "env-000002", "code": program.source,
           "verdict": {"class_name": "TowerOfHanoiEnv",
                       "written_hint": "Start with the smallest disk."}},
      ]
  }  # fmt: skip
  (tmp_path / "memory.json").write_text(json.dumps(memory))
  for target in ("env-000002", str(path)):
    proc = _run(
        ["spade.environments.play", target, "--workdir", str(tmp_path),
         "--seed", "4", "--show-hint", "--backend", "none"],
        stdin=":quit\n",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("[hint] Start with the smallest disk.\n")
  proc = _run(
      ["spade.environments.play", "NoSuchEnv", "--workdir", str(tmp_path)],
      stdin="",
  )
  assert proc.returncode == 2
  assert "has no program 'NoSuchEnv'" in proc.stderr
  assert "env-000002 (TowerOfHanoiEnv)" in proc.stderr


def test_play_runs_tool_calls_without_spending_turns():
  path = os.path.join(FIXTURES, "variants", "long_tool_chain.py")
  with open(path, encoding="utf-8") as f:
    env = runtime.instantiate(runtime.load_program(f.read()))
  env.reset(seed=2)
  proc = _run(
      ["spade.environments.play", path, "--seed", "2", "--backend", "none"],
      stdin="\n".join(env.solution()) + "\n",
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.count("[tool read_envelope] ") == 15
  assert proc.stdout.rstrip().endswith("[episode won]")


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


@pytest.mark.sandbox
def test_check_in_gvisor_accepts_the_reference_prompt_programs():
  proc, lines = _check_json(ACCEPTED)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert all(l["valid"] for l in lines) and len(lines) == len(ACCEPTED)
