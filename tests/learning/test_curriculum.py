"""The designer learns a curriculum from the agent's regret (the micro-world).

The tiny byte-level model is warm-started once: its agent head to answer
every level of spade/environments/microworld.py with two digits, so its
frontier is level 2 (it wins levels 1-2 and loses 3-6 without the hint;
with the hint, which types half the digits, it also wins levels 3-4), and
its designer head to write the family's programs at every level
(`train.warm_start_dir`). From those weights, runs of the real loop
(`experiments/curriculum.py`'s trainer: `spade.selfplay.loop.Trainer` with
configs/curriculum.py, the gVisor sandbox, the scorer, the update, memory)
with the agent's loss off, so the frontier stays where it is and only the
designer learns:

  blend     the reference's designer reward: the share of designs at the
            levels just above the frontier (3-4, where hinted plays win and
            unhinted ones do not) rises;
  negated   the same with the designer's loss negated
            (`optim.designer_loss_weight=-1`): it falls;
  regret    pure hint regret (`regret.window_reward="regret_based"`), one
            iteration: designs at levels 3-4 earn regret;
  no_hint   the same with the hint removed from the hinted plays (each
            gets an empty hint and the program's `hint()` is never asked):
            no design earns any, so the designer has no signal.

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
AGENT_REPLY = "77"  # every level: frontier 2
TARGET = (3, 4)  # won with the hint only
WARM_STEPS = 120
ITERATIONS = 1  # blend and negated: one designer update
LEARNING_RATE = 1e-3
MOVE = 0.08  # the least change of P(a TARGET level) each way


def _experiment():
  path = os.path.join(ROOT, "experiments", "curriculum.py")
  spec = importlib.util.spec_from_file_location("curriculum_experiment", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@functools.lru_cache(maxsize=None)
def warm(seed: int = 0):
  """(experiment module, params): the agent answers AGENT_REPLY to every
  level, the designer writes the family's programs."""
  exp = _experiment()
  params = exp.warm_params(
      seed,
      WARM_STEPS,
      tempfile.mkdtemp(prefix="curriculum-warm-"),
      5e-3,
      (AGENT_REPLY,),
  )
  return exp, params


def run(variant: str, seed: int = 0) -> dict:
  """One designer-only run from the shared warm start; its figures."""
  exp, params = warm(seed)
  from spade.agent import rollout  # pylint: disable=g-import-not-at-top

  overrides = [
      ("optim.agent_loss_weight", 0.0),
      ("optim.learning_rate", LEARNING_RATE),
      ("designer.temperature", 1.0),
  ]
  arm, iterations = "spade", ITERATIONS
  if variant == "negated":
    overrides.append(("optim.designer_loss_weight", -1.0))
  if variant in ("regret", "no_hint"):
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
        seed,
        iterations,
        tempfile.mkdtemp(prefix=f"curriculum-{variant}-"),
        params,
        exp.heldout_envs(),
        overrides,
        evaluate_every=0,
        evaluate_start=variant == "blend",
    )
  finally:
    rollout.run_episodes = original
  trace = res["trace"]
  share = lambda row: float(
      np.mean([lv in TARGET for lv in row["design_levels"]])
      if row["design_levels"]
      else 0.0
  )
  p_target = lambda probs: float(sum(probs[lv] for lv in TARGET))
  return {
      "frontier": res["start"].get("frontier"),
      "start": res["start"].get("per_level"),
      "levels": [sorted(r["design_levels"]) for r in trace],
      "target_share": [share(r) for r in trace],
      # P(the designer writes a TARGET level): before, after each update.
      "p_target": (
          [p_target(res["start"]["level_probs"])]
          + [p_target(r["level_probs"]) for r in trace]
      ),
      "design_rewards": [r["design_rewards"] for r in trace],
      "regret": [r["regret"] for r in trace],
      "reward": [r["designer_reward"] for r in trace],
      "wall_s": res["compute"]["wall_s"],
  }


def check_blend_against_negated(blend: dict, negated: dict) -> list[str]:
  """Failures of: the designer's probability of writing a TARGET level
  rises under the blend and falls under the negated reward."""
  failures = []
  b, n = blend["p_target"], negated["p_target"]
  if not b[-1] >= b[0] + MOVE:
    failures.append(f"the blend did not move the designer to {TARGET}: {b}")
  if not n[-1] <= n[0] - MOVE:
    failures.append(f"the negated reward did not move it away: {n}")
  return failures


def check_regret_needs_the_hint(with_hint: dict, no_hint: dict) -> list[str]:
  """Failures of: with the hint, pure regret pays the valid designs at
  TARGET more than the rest; without it, it pays no valid design anything."""
  failures = []
  rewards = with_hint["design_rewards"][0]
  at = [r for lv, r in rewards if lv in TARGET]
  off = [r for lv, r in rewards if lv not in TARGET]
  if not (at and off and np.mean(at) >= np.mean(off) + 0.5):
    failures.append(f"regret did not single out {TARGET}: {rewards}")
  if not with_hint["regret"][0] >= 0.1:
    failures.append(f"no regret with the hint: {with_hint}")
  if not no_hint["regret"][0] <= 0.02:
    failures.append(f"regret without the hint: {no_hint}")
  rewards = no_hint["design_rewards"][0]
  if not (rewards and max(abs(r) for _, r in rewards) <= 0.02):
    failures.append(f"designer reward without the hint: {rewards}")
  p = no_hint["p_target"]
  if not abs(p[-1] - p[0]) <= 0.01:
    failures.append(f"the designer moved without the hint: {p}")
  return failures


def _frontier_ok(figures: dict) -> list[str]:
  s = figures["start"]
  if not (s[1] >= 0.8 and s[2] >= 0.8 and max(s[3], s[4]) <= 0.2):
    return [f"the agent's warm start missed frontier 2: {s}"]
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
  figures = [l for l in proc.stdout.splitlines() if not l.startswith("spade")]
  assert proc.returncode == 0, "\n".join(figures) + proc.stderr[-3000:]


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
    failures += check_blend_against_negated(out["blend"], out["negated"])
  if "regret" in out and "no_hint" in out:
    failures += check_regret_needs_the_hint(out["regret"], out["no_hint"])
  for f in failures:
    print("FAILED:", f, flush=True)
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:] or ("blend", "negated", "regret", "no_hint")))
