"""`train.mode="adaptive"`: a levelled family at each environment's level.

The reference's fixed-environment loop with a difficulty controller
(`spade/core/fixed_env_orchestrator.py`, RLVE's recipe in
`cmd/games/train_fixed_rlve_*.sh`), on any family of
`spade.environments.levels`:

- every iteration plays `designer.num_envs` environments, the family's
  names taken round-robin (the reference's 16 RLVE environments with
  rollout batch 256 / 16 plays: all 16 every step); no designer, no hints;
- each environment's level is drawn from its window
  (`difficulty.SlidingWindow.sample`, fresh every iteration, as the
  orchestrator's `sample_difficulty`), and the family writes one program
  for it: one shared problem, played `agent.episodes_per_env` times;
- after the plays, the window learns from every unmasked play: accuracy 1
  when the return is >= 1 (RLVE's binary reward), else 0; failed episodes
  are left out, as the orchestrator leaves out FAILED trajectories;
- `difficulty/<environment>` (each window's top level) and the reference's
  aggregates go into the metrics.

The controller's state lives in the loop state
(`spade.selfplay.state.LoopState.difficulty`), so it is saved with the
checkpoint and a resumed run goes on where it stopped.
"""

from __future__ import annotations

import ml_collections
import numpy as np

from spade import console
from spade.environments import difficulty
from spade.environments import levels
from spade.selfplay import records
from spade.selfplay.seeding import seed_for


def controller(config: ml_collections.ConfigDict) -> difficulty.SlidingWindow:
  """The sliding window of `config.difficulty`."""
  d = config.difficulty
  return difficulty.SlidingWindow(
      tau_acc=float(d.tau_acc),
      tau_num=int(d.tau_num),
      d_delta=int(d.d_delta),
      min_level=int(d.min_level),
      max_level=int(d.max_level),
  )


def initial_state(config: ml_collections.ConfigDict) -> difficulty.State:
  """Every environment of `train.family` at its window's start."""
  return controller(config).init(levels.get(config.train.family).names)


def environments(
    config: ml_collections.ConfigDict, state, it: int
) -> tuple[list[records.Environment], list[tuple[str, int]]]:
  """Iteration `it`'s environments and the (name, level) each is played at.

  `state.difficulty` holds the windows. A problem the family cannot
  generate (`levels.GenerationError`) is left out and said so, as the
  reference counts a failed instance creation and goes on.
  """
  c = config
  family = levels.get(c.train.family)
  window = controller(c)
  names = list(family.names)
  envs, played = [], []
  for e in range(c.designer.num_envs):
    name = names[(it * c.designer.num_envs + e) % len(names)]
    level = window.sample(
        state.difficulty, name, seed_for(c.seed, it, "level", e)
    )
    try:
      source = family.program(name, level, seed_for(c.seed, it, "problem", e))
    except levels.GenerationError as err:
      console.say(
          "iteration %d: %s at level %d left out: %s", it + 1, name, level, err
      )
      continue
    envs.append(
        records.Environment(
            source=source,
            origin="pool",
            hint=None,
            name=f"{c.train.family}:{name}@d{level}",
        )
    )
    played.append((name, level))
  return envs, played


def update(
    config: ml_collections.ConfigDict,
    windows: difficulty.State,
    played: list[tuple[str, int]],
    returns: np.ndarray,
    mask: np.ndarray,
) -> difficulty.State:
  """The windows after this iteration's unhinted plays R[e, k, 0]."""
  plays = [
      (name, level, 1.0 if returns[e, k, 0] >= 1.0 else 0.0)
      for e, (name, level) in enumerate(played)
      for k in range(returns.shape[1])
      if mask[e, k, 0]
  ]
  return controller(config).update_many(windows, plays)
