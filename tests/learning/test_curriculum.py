"""The designer learns a curriculum from the agent's regret (the skill ladder).

The tiny byte-level model is warm-started once: its agent head to answer
every level of spade/environments/ladder.py with the secret's first
FRONTIER letters and random ones after them, so its frontier is FRONTIER
(it wins levels 1-3 always; level 4 when it guesses letter 4, 1 time in 4;
with the hint, which lowers every level by one letter, level 4 always), and
its designer head to write the ladder's programs at every level
(`train.warm_start_dir`). From those weights, short runs of the real loop
(`experiments/curriculum.py`'s trainer: `spade.selfplay.loop.Trainer` with
configs/curriculum.py, the gVisor sandbox, the scorer, the update, memory):

  blend     the reference's designer reward, the agent learning, two
            iterations: the designer's exact probability of writing a
            TARGET level (just above the frontier) rises with its first
            update, and in the second iteration the share of unhinted groups
            with mixed outcomes (the groups that carry signal) is at least
            twice the uniform pool's;
  negated   the same with the designer's loss negated
            (`optim.designer_loss_weight=-1`): that probability falls, and
            the mixed share is not twice the uniform pool's;
  uniform   the fixed pool uniform over the levels, two iterations;
  no_hint   pure hint regret, one iteration, the hinted plays given an
            empty hint and the program's `hint()` never asked: no design
            earns a reward.

  python tests/learning/test_curriculum.py            # all four, figures
  python tests/learning/test_curriculum.py blend negated
"""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
FRONTIER = 3
TARGET = (4, 5)  # regret > 0 only here: the hint wins level 4, and 5 at 1/4
WARM_STEPS = 200
LEARNING_RATE = 1e-3
ENVS = 16  # designs (and pool draws) an iteration
MOVE = 0.03  # the least change of P(a TARGET level) each way
RATIO = 2.0  # blend's mixed share over the uniform pool's, at least


def _experiment():
  path = os.path.join(ROOT, "experiments", "curriculum.py")
  spec = importlib.util.spec_from_file_location("curriculum_experiment", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@functools.lru_cache(maxsize=None)
def warm():
  """(experiment module, params): the agent at frontier FRONTIER, the
  designer writing the ladder's programs."""
  exp = _experiment()
  params = exp.warm_params(
      0,
      WARM_STEPS,
      tempfile.mkdtemp(prefix="curriculum-warm-"),
      5e-3,
      known=FRONTIER,
  )
  return exp, params


def run(variant: str) -> dict:
  """One short run from the shared warm start; its figures."""
  exp, params = warm()
  from spade.agent import rollout  # pylint: disable=g-import-not-at-top

  overrides = [
      ("optim.learning_rate", LEARNING_RATE),
      ("designer.temperature", 1.0),
      ("designer.num_envs", ENVS),
      ("designer.samples_per_prompt", ENVS),
  ]
  arm, iterations = "spade", 2
  if variant == "negated":
    overrides.append(("optim.designer_loss_weight", -1.0))
  elif variant == "uniform":
    arm = "uniform"
  elif variant == "no_hint":
    arm, iterations = "regret", 1
  original = rollout.run_episodes
  if variant == "no_hint":

    def without_hint(specs, *args, **kwargs):
      specs = [
          s
          if s.hint is not rollout.ENV_HINT
          else s.__class__(s.env_index, s.source, s.seed, "", s.sample)
          for s in specs
      ]
      return original(specs, *args, **kwargs)

    rollout.run_episodes = without_hint
  try:
    res = exp.run_arm(
        arm,
        0,
        iterations,
        tempfile.mkdtemp(prefix=f"curriculum-{variant}-"),
        params,
        overrides,
    )
  finally:
    rollout.run_episodes = original
  trace = res["trace"]
  p_target = lambda probs: float(sum(probs[str(lv)] for lv in TARGET))
  level_probs = [res["start"]["level_probs"]] + [
      r["level_probs"] for r in trace
  ]
  return {
      "start": res["start"]["win_probs"],
      "frontier": res["start"]["frontier"],
      "played": [sorted(r["played_levels"]) for r in trace],
      "mixed_share": [r["mixed_share"] for r in trace],
      # P(the designer writes a TARGET level): before, after each update.
      "p_target": [p_target(p) for p in level_probs if p],
      "design_rewards": [r["design_rewards"] for r in trace],
      "regret": [r["regret"] for r in trace],
      "wall_s": res["compute"]["wall_s"],
  }


def check_designer(blend: dict, negated: dict) -> list[str]:
  """Failures of: one designer update raises P(a TARGET level) under the
  blend and lowers it under the negated reward."""
  failures = []
  b, n = blend["p_target"], negated["p_target"]
  if not b[1] >= b[0] + MOVE:
    failures.append(f"the blend did not move the designer to {TARGET}: {b}")
  if not n[1] <= n[0] - MOVE:
    failures.append(f"the negated reward did not move it away: {n}")
  return failures


def check_signal(blend: dict, negated: dict, uniform: dict) -> list[str]:
  """Failures of: in the second iteration the blend's share of mixed
  unhinted groups is at least RATIO x the uniform pool's, the negated
  reward's is not."""
  failures = []
  u = uniform["mixed_share"][1]
  if not blend["mixed_share"][1] >= RATIO * u:
    failures.append(
        f"the blend's mixed share {blend['mixed_share']} is under {RATIO} x"
        f" the uniform pool's {uniform['mixed_share']}"
    )
  if not negated["mixed_share"][1] < RATIO * u:
    failures.append(
        f"the negated reward's mixed share {negated['mixed_share']} is"
        f" {RATIO} x the uniform pool's {uniform['mixed_share']}"
    )
  return failures


def check_no_hint(no_hint: dict) -> list[str]:
  """Failures of: without the hint no valid design earns a reward."""
  rewards = no_hint["design_rewards"][0]
  if not rewards:
    return [f"no valid design without the hint: {no_hint}"]
  if max(abs(r) for _, r, _ in rewards) > 0.0 or no_hint["regret"][0]:
    return [f"a reward without the hint: {rewards}, {no_hint['regret']}"]
  return []


def _frontier_ok(figures: dict) -> list[str]:
  s = figures["start"]
  if not (
      figures["frontier"] == FRONTIER
      and s[str(FRONTIER)] >= 0.8
      and s[str(FRONTIER + 1)] <= 0.4
  ):
    return [f"the agent's warm start missed frontier {FRONTIER}: {s}"]
  return []


def test_the_designer_follows_regret_only_with_the_hint():
  # One process for the four runs (they share one warm start), with one
  # host device as a user's run has (the test harness fakes eight).
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  proc = subprocess.run(
      [sys.executable, os.path.abspath(__file__)],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=1800,
      check=False,
  )
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]


def main(variants) -> int:
  sys.path.insert(0, ROOT)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  t0 = time.time()
  out = {}
  for v in variants:
    out[v] = run(v)
    print(v, out[v], f"({time.time() - t0:.0f} s)", flush=True)
  failures = []
  if "blend" in out:
    failures += _frontier_ok(out["blend"])
  if "blend" in out and "negated" in out:
    failures += check_designer(out["blend"], out["negated"])
    if "uniform" in out:
      failures += check_signal(out["blend"], out["negated"], out["uniform"])
  if "no_hint" in out:
    failures += check_no_hint(out["no_hint"])
  for f in failures:
    print("FAILED:", f, flush=True)
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:] or ("blend", "negated", "uniform", "no_hint")))
