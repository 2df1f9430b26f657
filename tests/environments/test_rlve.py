"""RLVE's environments as programs: RLVE's own scores, a clean trainer, the
sandbox."""

import importlib.util
import json
import os
import random
import subprocess
import sys
import threading

import numpy as np
import pytest

from spade.environments import levels
from spade.environments import rlve
from spade.environments import static_check

# Found, not imported: the trainer's process never imports rlve-gym.
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("Gym") is None,
    reason="rlve-gym is not installed (pip install -e '.[eval]')",
)

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)

# Runs in its own process: the program next to RLVE's own verifier on the
# same replies (rlve-gym imports torch and reseeds global generators).
_COMPARE = r"""
import json, sys
from Gym.environments import identifier2environment
problems = json.loads(sys.stdin.read())
out = []
for source, name, config, replies in problems:
    scope = {}
    exec(compile(source, name, "exec"), scope)
    env = scope["Rlve" + name + "Env"]()
    ours = []
    for reply in replies:
        env.reset(seed=0)
        ours.append(env.step(reply)[1])
    task = identifier2environment[name]()
    task.set_config(config)
    theirs = []
    for reply in replies:
        # RlveGymWrapper.step: the first box as <answer>, then the verifier.
        boxed = scope["_extract_boxed_answer"](reply)
        action = reply + ("\n<answer>" + boxed + "</answer>" if boxed else "")
        theirs.append(1.0 if task.verifier(action)["accuracy"] else 0.0)
    out.append([name, ours, theirs])
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def family():
  f = rlve.Rlve()
  yield f
  f.close()


def _replies(answer):
  text = " ".join(map(str, answer)) if isinstance(answer, list) else answer
  return [
      f"The answer is \\boxed{{{text}}}.",
      "\\boxed{definitely wrong}",
      f"<answer>{text}</answer>",  # no box: RLVE still reads the tag
      "no answer at all",
  ]


def test_the_family_is_registered_with_the_16_official_environments():
  assert levels.get("rlve").names == rlve.OFFICIAL
  assert len(rlve.OFFICIAL) == 16


@pytest.mark.parametrize("level", [0, 4])
def test_programs_score_replies_as_rlves_verifier_does(family, level):
  problems, expected_right = [], {}
  for name in rlve.OFFICIAL:
    problem = family.generate(name, level, seed=11)
    source = rlve.render(problem)
    # Standard library only, and nothing the static pass refuses.
    assert static_check.check(source) is None, name
    assert (
        "import Gym" not in source
        and "networkx" not in source.split("# rlve-gym Gym/environments")[0]
    )
    answer = eval(problem["answer"])  # pylint: disable=eval-used
    config = eval(problem["config"])  # pylint: disable=eval-used
    problems.append([source, name, config, _replies(answer)])
    # LargestConvexPolygon's gold answer is the area, not a polygon.
    expected_right[name] = name != "LargestConvexPolygon"
  proc = subprocess.run(
      [sys.executable, "-c", _COMPARE],
      input=json.dumps(problems),
      capture_output=True,
      text=True,
      cwd=ROOT,
      timeout=600,
      check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  for name, ours, theirs in json.loads(proc.stdout.splitlines()[-1]):
    assert ours == theirs, name
    assert ours[0] == (1.0 if expected_right[name] else 0.0), name
    assert ours[1] == ours[3] == 0.0, name


def test_a_problem_is_fixed_by_name_level_and_seed(family):
  a = family.program("Sorting", 3, 5)
  assert family.program("Sorting", 3, 5) == a
  assert family.program("Sorting", 3, 6) != a
  # Levels are clamped to the adapter's [0, 20].
  assert family.generate("Division", 99, 1)["level"] == rlve.MAX_LEVEL
  with pytest.raises(KeyError, match="not one of"):
    family.program("Nope", 0, 0)


def test_generation_leaves_the_trainers_process_alone():
  random.seed(3)
  np.random.seed(3)
  py_state, np_state = random.getstate(), np.random.get_state()
  threads = threading.active_count()
  loaded = {"Gym", "torch"} & set(sys.modules)
  f = rlve.Rlve()
  f.program("Multiplication", 2, 9)
  f.program("ShortestPath", 2, 9)
  worker = f._proc  # pylint: disable=protected-access
  assert random.getstate() == py_state
  assert all(
      np.array_equal(a, b) for a, b in zip(np.random.get_state(), np_state)
  )
  # Other tests of the process may have imported torch; rlve adds neither.
  assert {"Gym", "torch"} & set(sys.modules) == loaded
  f.close()
  assert worker.poll() is not None  # the worker (and its threads) are gone
  assert threading.active_count() == threads


@pytest.mark.sandbox
def test_programs_are_valid_and_pay_the_right_answer_in_the_sandbox(family):
  from spade.sandbox.pool import SandboxPool  # pylint: disable=g-import-not-at-top

  sources, answers = [], []
  for name in rlve.OFFICIAL:
    problem = family.generate(name, 2, seed=4)
    sources.append(rlve.render(problem))
    answers.append(_replies(eval(problem["answer"]))[0])  # pylint: disable=eval-used
  with SandboxPool("gvisor", 1, preload=(), warm_spare=False) as pool:
    verdicts = pool.validate(sources)
    for name, verdict in zip(rlve.OFFICIAL, verdicts):
      assert verdict["valid"], (name, verdict)
    opened = pool.open_many([{"source": s, "seed": 0} for s in sources])
    assert all(o["ok"] for o in opened), opened
    results = pool.step_many(
        [(o["handle"], a) for o, a in zip(opened, answers)]
    )
    for name, result in zip(rlve.OFFICIAL, results):
      assert result["ok"] and result["terminated"], (name, result)
      right = name != "LargestConvexPolygon"
      assert result["reward"] == (1.0 if right else 0.0), (name, result)
