"""The designer learns a curriculum from the agent's regret (the micro-world).

The tiny byte-level model is warm-started once: its agent head to type 1 or
2 digits for levels 1 and 2 (the engine's warm start on those programs'
solutions), so its frontier sits at a known level, then its designer head
to write the family's programs at every level (`train.warm_start_dir`).
From those weights, runs of the real loop (`spade.selfplay.loop.Trainer`
with configs/curriculum.py, the gVisor sandbox, the scorer, the update,
memory) with the agent's loss off, so the frontier stays where it is and
only the designer learns:

  blend        the reference's designer reward: the designs' levels move to
               the level above the frontier, where hinted plays win and
               unhinted ones do not;
  negated      the same with the designer's loss negated
               (`optim.designer_loss_weight=-1`): they do not;
  regret       pure hint regret (`regret.window_reward="regret_based"`):
               designs above the frontier earn it;
  no hint      the same with the hint removed from the hinted plays (they
               are played with an empty hint, the program's `hint()` never
               asked): every design earns ~0, no signal.

  python experiments/curriculum_check.py             # all four, the checks
  python experiments/curriculum_check.py blend negated

It prints each run's figures and exits 1 when a check fails. It is not yet
in the test suite: its thresholds come from a single run (docs/curriculum.md
gives the figures), and the hint check does not hold for this agent.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import tempfile
import time
import types

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AGENT_LEVELS = (1, 2)  # the agent's warm start: its frontier
AGENT_STEPS = 60
DESIGNER_STEPS = 240
ITERATIONS = 4


def _experiment():
  spec = importlib.util.spec_from_file_location(
      "curriculum_experiment",
      os.path.join(ROOT, "experiments", "curriculum.py"),
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@functools.lru_cache(maxsize=None)
def warm(seed: int = 0):
  """Warm-started params (agent to AGENT_LEVELS, designer to the family)."""
  exp = _experiment()
  from configs import curriculum as cfg  # pylint: disable=g-import-not-at-top
  from spade.environments import microworld  # pylint: disable=g-import-not-at-top
  from spade.selfplay import loop  # pylint: disable=g-import-not-at-top

  import jax  # pylint: disable=g-import-not-at-top

  c = cfg.get_config("spade")
  c.seed = seed
  c.optim.learning_rate = 5e-3
  t = loop.Trainer(c, tempfile.mkdtemp(prefix="curriculum-warm-"))
  agent_seeds = [
      types.SimpleNamespace(
          name=f"{n}_{lv}", source=microworld.program(n, lv, 1)
      )
      for n in microworld.NAMES
      for lv in AGENT_LEVELS
  ]
  c.train.warm_start_dir = ""  # the seeds' solutions: the agent
  t.engine.warm_start(agent_seeds, AGENT_STEPS)
  c.train.warm_start_dir = microworld.TRAIN_DIR  # the designer
  t.engine.warm_start(t.seeds, DESIGNER_STEPS)
  params = jax.device_get(t.engine.state.params)
  t.envs.close()
  return exp, params


def run(variant: str, seed: int = 0, iterations: int = ITERATIONS) -> dict:
  """One designer-only run from the shared warm start; its figures."""
  exp, params = warm(seed)
  from spade.agent import rollout  # pylint: disable=g-import-not-at-top

  overrides = [("optim.agent_loss_weight", 0.0), ("optim.learning_rate", 3e-4)]
  arm = "spade"
  if variant == "negated":
    overrides.append(("optim.designer_loss_weight", -1.0))
  if variant in ("regret", "no_hint"):
    arm = "regret"
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
    )
  finally:
    rollout.run_episodes = original
  trace = res["trace"]
  frontier = trace[0]["heldout"]["frontier"]
  target = frontier + 1

  def share(rows):
    lv = [x for r in rows for x in r["design_levels"]]
    return float(np.mean([x == target for x in lv])) if lv else 0.0

  return {
      "frontier": [r["heldout"]["frontier"] for r in trace],
      "levels": [r["design_levels"] for r in trace],
      "target_share_first": share(trace[:1]),
      "target_share_late": share(trace[-2:]),
      "reward": [r["designer_reward"] for r in trace],
      "reward_abs_mean": float(
          np.mean([abs(r["designer_reward"]) for r in trace])
      ),
      "regret": [r["regret"] for r in trace],
  }


def check_blend_against_negated(blend: dict, negated: dict) -> list[str]:
  """Failures of: the blend moves designs to the level above the frontier
  (8 designs an iteration: the share there over the last two iterations),
  the negated reward does not."""
  failures = []
  if not blend["target_share_late"] > blend["target_share_first"] + 0.1:
    failures.append(f"blend did not move to the frontier: {blend}")
  if not negated["target_share_late"] < negated["target_share_first"] + 0.05:
    failures.append(f"negated moved to the frontier: {negated}")
  if not blend["target_share_late"] > negated["target_share_late"] + 0.15:
    failures.append("blend not above negated")
  return failures


def check_regret_needs_the_hint(with_hint: dict, no_hint: dict) -> list[str]:
  """Failures of: pure regret (max(0, hinted - unhinted) per environment)
  has signal with the hint and only sampling noise without it."""
  failures = []
  if not np.mean(with_hint["regret"]) > 2 * np.mean(no_hint["regret"]):
    failures.append(f"regret without the hint as large: {no_hint}")
  if not np.mean(with_hint["regret"]) > 0.05:
    failures.append(f"no regret with the hint: {with_hint}")
  return failures


def main(variants) -> int:
  sys.path.insert(0, ROOT)
  t0 = time.time()
  out = {}
  for v in variants:
    out[v] = run(v)
    print(v, out[v], f"({time.time() - t0:.0f} s)", flush=True)
  failures = []
  if "blend" in out and "negated" in out:
    failures += check_blend_against_negated(out["blend"], out["negated"])
  if "regret" in out and "no_hint" in out:
    failures += check_regret_needs_the_hint(out["regret"], out["no_hint"])
  for f in failures:
    print("FAILED:", f, flush=True)
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:] or ("blend", "negated", "regret", "no_hint")))
