r"""SPADE's curriculum against the paper's baselines on the micro-world.

  python experiments/curriculum.py                      # the whole experiment
  python experiments/curriculum.py --arms=spade,uniform --seeds=1 \
      --iterations=4                                    # a reduced one

The family is spade/environments/microworld.py (docs/curriculum.md): reply
with L digits, L in 1..6 set by the program's `DIGITS = L` line. For each
seed the tiny byte-level model is warm-started once (`Engine.warm_start` on
`train.warm_start_dir`: the designer learns to write the family's programs
at every level), and every arm starts from those weights and runs
`spade.selfplay.loop.Trainer` with its `configs/curriculum.py` variant (the
gVisor sandbox, the scorer, the update, memory):

  spade, frozen, uniform, adaptive, hardest, regret    (configs/curriculum.py)

Every arm plays `designer.num_envs x agent.episodes_per_env` unhinted
episodes an iteration for the same iterations (designs that fail validation
are topped up from the uniform pool), so the agent's training compute is
equal; its sampled agent tokens are counted and reported with each arm's
other compute (designer tokens, hinted-play tokens, designer update rows).
After every iteration the agent plays the held-out programs
(spade/environments/pools/microworld/heldout/, never in a warm start, a pool
or memory) without the hint: the held-out return per level, their mean and
the frontier (the highest level won at least half the time) per iteration;
the final iteration's mean is the arm's score.

Ends with one line `spade=... frozen=... uniform=... adaptive=...
hardest=... regret=... spread=...` (each arm's mean held-out return over
seeds; spread: the largest std over seeds of any arm; an arm that could not
run is `nan`) and writes plots and results.json to the folder it prints.
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The arms compile the same programs: later compilations are loads.
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR",
    os.path.join(tempfile.gettempdir(), "spade-curriculum-jax"),
)

import jax  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top

from configs import curriculum as curriculum_config  # pylint: disable=g-import-not-at-top
from spade import console  # pylint: disable=g-import-not-at-top
from spade.environments import microworld  # pylint: disable=g-import-not-at-top
from spade.model import transformer  # pylint: disable=g-import-not-at-top
from spade.selfplay import engine as engine_lib  # pylint: disable=g-import-not-at-top
from spade.selfplay import loop  # pylint: disable=g-import-not-at-top
from spade.selfplay import play as play_lib  # pylint: disable=g-import-not-at-top
from spade.selfplay import records  # pylint: disable=g-import-not-at-top
from spade.train import state as state_lib  # pylint: disable=g-import-not-at-top

ARMS = curriculum_config.ARMS


def note(fmt: str, *args) -> None:
  """The experiment's own line (the loop's are muted while an arm runs)."""
  print(
      "curriculum: " + (fmt % args if args else fmt),
      file=sys.stderr,
      flush=True,
  )


EVAL_EPISODES = 8  # per held-out program (3 a level) and evaluation
# The agent's warm start: 1, 2 or 3 digits 6:3:1 whatever the level, so it
# wins level 1 always, level 2 ~40% and level 3 ~10% of the time (frontier
# 1) and explores the lengths above it.
AGENT_REPLIES = "7,7,7,7,7,7,77,77,77,777"


def heldout_envs() -> list[records.Environment]:
  """The held-out programs, one `Environment` each, ordered by level."""
  out = []
  for name in sorted(os.listdir(microworld.HELDOUT_DIR)):
    if name.endswith(".py"):
      with open(os.path.join(microworld.HELDOUT_DIR, name)) as f:
        out.append(records.Environment(f.read(), "pool", None, name=name))
  return sorted(out, key=lambda e: microworld.level_of(e.source))


def evaluate(trainer, envs, it: int, episodes: int = EVAL_EPISODES) -> dict:
  """The agent's unhinted held-out return per level (the loop's rollout)."""
  c = copy.deepcopy(trainer.config)
  c.agent.episodes_per_env = episodes
  c.agent.plays_per_iteration = 0
  eps, _ = play_lib.play(
      c, trainer.engine, trainer.envs, 100_000 + it, envs, hinted_arm=False
  )
  by_level = collections.defaultdict(list)
  for ep in eps:
    level = microworld.level_of(envs[ep.env_index].source)
    by_level[level].append(ep.episode_return(c.agent.return_rule))
  per_level = {lv: float(np.mean(v)) for lv, v in sorted(by_level.items())}
  won = [lv for lv, r in per_level.items() if r >= 0.5]
  return {
      "per_level": per_level,
      "mean": float(np.mean(list(per_level.values()))),
      "frontier": max(won) if won else 0,
  }


def level_distribution(trainer) -> dict[int, float]:
  """The designer head's distribution over the level it writes: P(`D = L`
  | the design prompt), renormalised over the family's levels (the prompt
  is the same for every design: configs/curriculum.py). Exact, where the
  sampled designs' levels are 8 draws of it."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from spade.train import lora  # pylint: disable=g-import-not-at-top

  e = trainer.engine
  prompt = engine_lib._folder_rows(e, trainer.config.train.warm_start_dir)[0]  # pylint: disable=protected-access
  ids = list(prompt.prompt_ids) + e.tokenizer.encode("D = ")
  tokens = jnp.asarray([ids], jnp.int32)
  positions = jnp.arange(len(ids), dtype=jnp.int32)[None]
  logits, _ = e.model.apply(
      lora.variables(e.state.params),
      tokens,
      positions,
      transformer.Role.DESIGNER,
      last_only=True,
  )
  digit = [e.tokenizer.encode(str(lv))[0] for lv in microworld.LEVELS]
  logp = jax.nn.log_softmax(np.asarray(logits[0, -1], np.float64))
  p = np.exp(np.asarray(logp)[digit])
  p = p / p.sum()
  return {lv: float(x) for lv, x in zip(microworld.LEVELS, p)}


class _Counting:
  """Wraps `play.play` to count each iteration's agent episodes and tokens
  by arm (hinted or not); the loop itself is unchanged."""

  def __init__(self):
    self.rows = []
    self._play = play_lib.play

  def __enter__(self):
    def counted(*args, **kwargs):
      episodes, stats = self._play(*args, **kwargs)
      row = collections.Counter()
      for ep in episodes:
        arm = "hinted" if ep.hinted else "unhinted"
        row[f"{arm}_episodes"] += 1
        row[f"{arm}_tokens"] += sum(len(t.completion_ids) for t in ep.turns)
      self.rows.append(dict(row))
      return episodes, stats

    play_lib.play = counted
    return self

  def __exit__(self, *exc):
    play_lib.play = self._play


class CurriculumTrainer(loop.Trainer):
  """The loop's Trainer, plus a held-out evaluation every `evaluate_every`
  iterations, the designs' levels and rewards and the designer's level
  distribution (measurement only: it trains nothing)."""

  def __init__(self, config, workdir, heldout, warm=None, evaluate_every=1):
    super().__init__(config, workdir)
    if warm is not None:
      # The warm start's parameters; the optimizer starts afresh, as in a
      # new run.
      e = self.engine
      e.state = state_lib.create_state(
          warm,
          e.optimizer,
          rng=jax.random.fold_in(jax.random.PRNGKey(config.seed), 1),
          mesh=e.mesh,
          rules=e.rules,
      )
    self.heldout = heldout
    self.evaluate_every = evaluate_every
    self.label = os.path.basename(workdir)
    self.trace = []
    self._rewards = []

  def _save_programs(self, it, designs, envs, scores, window_scores, *a):
    # Each valid design's (level, designer reward) as the window scored it.
    self._rewards = [
        (
            microworld.level_of(d.code),
            float(window_scores.design_reward[d.index]),
        )
        for d in designs
        if d.valid
    ]
    return super()._save_programs(it, designs, envs, scores, window_scores, *a)

  def iteration(self, it):
    m = super().iteration(it)
    levels = [microworld.level_of(d.code) for d in self.designed if d.valid]
    every = self.evaluate_every
    ev = (
        evaluate(self, self.heldout, it)
        if every and (it + 1) % every == 0
        else None
    )
    self.trace.append(
        {
            "iteration": it + 1,
            "design_levels": [lv for lv in levels if lv is not None],
            "designs": len(self.designed),
            "designer_tokens": sum(
                len(d.completion_ids) for d in self.designed
            ),
            "designer_rows": m.get("update/designer_rows", 0.0),
            "heldout": ev,
            "return_nohint": m.get("agent/return_nohint"),
            "return_hint": m.get("agent/return_hint"),
            "regret": m.get("regret/mean"),
            "designer_reward": m.get("designer/reward_mean", 0.0),
            "design_rewards": self._rewards,
            "level_probs": level_distribution(self),
            "seconds": m.get("time/iteration_s"),
        }
    )
    held = (
        "held-out %s (mean %.2f, frontier %d)"
        % (
            " ".join(f"{r:.2f}" for r in ev["per_level"].values()),
            ev["mean"],
            ev["frontier"],
        )
        if ev
        else "regret %.3f" % (m.get("regret/mean") or 0.0)
    )
    note(
        "  %s iter %d/%d: designs at levels %s, %s (%.1f s)",
        self.label,
        it + 1,
        self.config.num_iterations,
        sorted(levels),
        held,
        m.get("time/iteration_s") or 0.0,
    )
    return m


def agent_rows(engine, config, replies, seeds=range(500, 502)):
  """Supervised agent rows: each of `replies` to the first observation of
  every variant and level (tags from `seeds`, none held out); the agent
  learns their mixture, whatever the level."""
  from spade.agent import prompts as agent_prompts  # pylint: disable=g-import-not-at-top
  from spade.selfplay import batching  # pylint: disable=g-import-not-at-top

  eos = [engine.tokenizer.eos_id]
  completions = [engine.tokenizer.encode(r) + eos for r in replies]
  rows = []
  for name in microworld.NAMES:
    for level in microworld.LEVELS:
      for seed in seeds:
        scope = {}
        exec(microworld.program(name, level, seed), scope)  # pylint: disable=exec-used
        observation, _ = scope["DigitLockEnv"]().reset(seed=0)
        ids = agent_prompts.truncate_messages(
            agent_prompts.history_messages(
                observation, None, [], style=config.agent.prompt_style
            ),
            engine.render,
            engine.prompt_budget("agent"),
        )
        rows += [batching.Row(ids, c, [], 1.0) for c in completions]
  return rows


def warm_params(seed: int, steps: int, workdir: str, lr: float, replies=()):
  """The warm start, once per seed; every arm of the seed starts from its
  parameters (on the host). The designer learns the family's programs at
  every level (`train.warm_start_dir`); with `replies`, the agent learns
  to answer every level with their mixture (`agent_rows`)."""
  c = curriculum_config.get_config("spade")
  c.seed = seed
  c.optim.learning_rate = lr
  start = time.time()
  with console.muted():
    t = loop.Trainer(c, workdir)
    e = t.engine
    designer = engine_lib._folder_rows(e, c.train.warm_start_dir)  # pylint: disable=protected-access
    agent = agent_rows(e, c, replies) if replies else []
    e._warm_start_rows(designer, agent, steps)  # pylint: disable=protected-access
  note("  warm start: %d steps in %.0f s", steps, time.time() - start)
  params = jax.device_get(e.state.params)
  t.envs.close()
  return params


def run_arm(
    arm,
    seed,
    iterations,
    workdir,
    warm,
    heldout,
    overrides=(),
    evaluate_every=1,
    evaluate_start=True,
):
  """Trains one arm from the `warm` parameters; returns its held-out
  evaluation before training ("start"), its trace (held-out figures every
  `evaluate_every` iterations; 0: none) and its compute."""
  c = curriculum_config.get_config(arm)
  c.seed = seed
  c.num_iterations = iterations
  c.train.warm_start_steps = 0  # the seed's shared warm start instead
  for key, value in overrides:
    node = c
    *path, last = key.split(".")
    for p in path:
      node = node[p]
    node[last] = value
  t0 = time.time()
  with _Counting() as counts, console.muted():
    t = CurriculumTrainer(c, workdir, heldout, warm, evaluate_every)
    start = evaluate(t, heldout, -1) if evaluate_start else {}
    start["level_probs"] = level_distribution(t)
    t.run()
  # Count the training plays only: the first call may be the start's
  # evaluation, then each iteration plays once and is evaluated or not.
  train_rows, i = [], int(evaluate_start)
  for row in t.trace:
    train_rows.append(counts.rows[i])
    i += 1 if row["heldout"] is None else 2
  played = collections.Counter()
  for row in train_rows:
    played.update(row)
  compute = {
      "agent_episodes": played["unhinted_episodes"],
      "agent_tokens": played["unhinted_tokens"],
      "hinted_episodes": played["hinted_episodes"],
      "hinted_tokens": played["hinted_tokens"],
      "designer_tokens": sum(r["designer_tokens"] for r in t.trace),
      "designer_update_rows": sum(r["designer_rows"] for r in t.trace),
      "wall_s": time.time() - t0,
  }
  return {"start": start, "trace": t.trace, "compute": compute}


def plots(results: dict, folder: str) -> list[str]:
  """PNGs: per arm, the designs' level distribution and the frontier per
  iteration; the held-out return per arm with its spread over seeds."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  written = []
  arms = [a for a in ARMS if results.get(a)]
  fig, axes = plt.subplots(
      1, len(arms), figsize=(3.2 * len(arms), 3.2), squeeze=False
  )
  levels = microworld.LEVELS
  for ax, arm in zip(axes[0], arms):
    runs = list(results[arm].values())
    n_it = len(runs[0]["trace"])
    dist = np.zeros((len(levels), n_it))
    for run in runs:
      for i, row in enumerate(run["trace"]):
        for lv in row["design_levels"]:
          if lv in levels:
            dist[levels.index(lv), i] += 1
    dist /= np.maximum(dist.sum(0, keepdims=True), 1)
    ax.imshow(
        dist, origin="lower", aspect="auto", cmap="Blues", vmin=0, vmax=1,
        extent=(0.5, n_it + 0.5, levels[0] - 0.5, levels[-1] + 0.5),
    )  # fmt: skip
    for run in runs:
      ax.plot(
          [r["iteration"] for r in run["trace"]],
          [r["heldout"]["frontier"] for r in run["trace"]],
          color="tab:red", alpha=0.7,
      )  # fmt: skip
    ax.set_title(arm)
    ax.set_xlabel("iteration")
    ax.set_ylim(-0.5, levels[-1] + 0.5)
  axes[0][0].set_ylabel("level (designs: blue; frontier: red)")
  fig.tight_layout()
  path = os.path.join(folder, "levels_and_frontier.png")
  fig.savefig(path, dpi=90)
  plt.close(fig)
  written.append(path)

  fig, ax = plt.subplots(figsize=(6, 4))
  for arm in arms:
    curves = np.array(
        [
            [r["heldout"]["mean"] for r in run["trace"]]
            for run in results[arm].values()
        ]
    )
    x = np.arange(1, curves.shape[1] + 1)
    mean, std = curves.mean(0), curves.std(0)
    ax.plot(x, mean, label=arm)
    ax.fill_between(x, mean - std, mean + std, alpha=0.2)
  ax.set_xlabel("iteration")
  ax.set_ylabel("held-out return (mean over levels)")
  ax.legend()
  fig.tight_layout()
  path = os.path.join(folder, "heldout_return.png")
  fig.savefig(path, dpi=90)
  plt.close(fig)
  written.append(path)
  return written


def summary_line(results: dict) -> str:
  """`spade=... frozen=... ... spread=...` from the final held-out means."""
  parts, spread = [], 0.0
  for arm in ARMS:
    finals = [
        run["trace"][-1]["heldout"]["mean"]
        for run in results.get(arm, {}).values()
        if run["trace"]
    ]
    if finals:
      parts.append(f"{arm}={np.mean(finals):.3f}")
      spread = max(spread, float(np.std(finals)))
    else:
      parts.append(f"{arm}=nan")
  return " ".join(parts) + f" spread={spread:.3f}"


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--arms", default=",".join(ARMS))
  p.add_argument("--seeds", type=int, default=3)
  p.add_argument("--iterations", type=int, default=8)
  p.add_argument("--warm_start_steps", type=int, default=240)
  p.add_argument("--warm_start_lr", type=float, default=5e-3)
  p.add_argument(
      "--agent_replies",
      default=AGENT_REPLIES,
      help="the agent's warm start: the mixture of these replies to every"
      " level; empty: a random agent",
  )
  p.add_argument("--out", default="")
  args = p.parse_args(argv)
  console.quiet(verbose=False)
  out = args.out or tempfile.mkdtemp(prefix="spade-curriculum-")
  os.makedirs(out, exist_ok=True)
  note("writing to %s", out)
  arms = [a for a in args.arms.split(",") if a]
  heldout = heldout_envs()
  results: dict = {a: {} for a in arms}
  t0 = time.time()
  done, total = 0, args.seeds * len(arms)
  for seed in range(args.seeds):
    note("seed %d: warm start (%d steps)", seed, args.warm_start_steps)
    warm = warm_params(
        seed,
        args.warm_start_steps,
        os.path.join(out, f"warm_{seed}"),
        args.warm_start_lr,
        tuple(r for r in args.agent_replies.split(",") if r),
    )
    for arm in arms:
      try:
        res = run_arm(
            arm,
            seed,
            args.iterations,
            os.path.join(out, f"{arm}_{seed}"),
            warm,
            heldout,
        )
      except ValueError as e:  # a config this loop refuses
        note("arm %s skipped: %s", arm, e)
        continue
      results[arm][seed] = res
      done += 1
      final = res["trace"][-1]["heldout"]
      elapsed = time.time() - t0
      note(
          "seed %d, %s: held-out %.3f, frontier %d; %d/%d runs in %.0f s,"
          " ETA %.0f s",
          seed, arm, final["mean"], final["frontier"], done, total, elapsed,
          elapsed / done * (total - done),
      )  # fmt: skip
      with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
  paths = plots(results, out)
  note("plots: %s", ", ".join(paths))
  note("results: %s", os.path.join(out, "results.json"))
  note("total wall time %.0f s", time.time() - t0)
  print(summary_line(results))


if __name__ == "__main__":
  main()
