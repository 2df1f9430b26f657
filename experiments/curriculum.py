r"""SPADE's curriculum against the paper's baselines on the skill ladder.

  python experiments/curriculum.py                      # the whole experiment
  python experiments/curriculum.py --arms=scripted,uniform --seeds=1 \
      --iterations=4                                    # a reduced one

The family is spade/environments/ladder.py (docs/curriculum.md): level L (1
to 16, the program's `L = ...` line) pays 1 when the reply starts with the
first L letters of a fixed secret over 4 letters; the hint lowers that by
one letter. The tiny byte-level model is warm-started once: the designer
to write the ladder's programs (each level once), the agent to answer every
level with 16 random letters (frontier 0). Every arm of every seed starts
from those weights (differences are paired by seed) and runs
`spade.selfplay.loop.Trainer` with its `configs/curriculum.py` variant (the
gVisor sandbox, the scorer, the update, memory):

  spade, regret, frozen, uniform, adaptive, scripted    (configs/curriculum.py)

`scripted` plays the level just above the agent's measured frontier every
iteration (a fixed pool of that one program): what a perfect designer
would do. Every arm plays `designer.num_envs x agent.episodes_per_env`
unhinted episodes an iteration, and their advantages are the same rule's,
so the agent's episodes and update rows are equal; hinted plays, designer
tokens and designer update rows are the designer's compute, counted per
arm in results.json.

The metric is exact: after every iteration, the agent's win probability at
each level is computed from its log-probabilities, teacher-forced over the
secret's first L letters after the level's prompt (the probability that a
sampled reply starts with them); the frontier is the highest level with
win probability >= 0.5, and an arm's score is its mean frontier over the
run's iterations (the area under the frontier curve over the iterations).

Ends with one line `spade=... regret=... frozen=... uniform=... adaptive=...
scripted=... gap_uniform=... gap_frozen=... se=...`: each arm's score
(mean over seeds), the mean paired differences spade - uniform and spade
- frozen (same seed, same warm start), and the larger of their standard
errors over seeds; an arm that could not run is `nan`. Plots and
results.json go to the folder it prints.
"""

from __future__ import annotations

import argparse
import collections
import functools
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
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top

from configs import curriculum as curriculum_config  # pylint: disable=g-import-not-at-top
from spade import console  # pylint: disable=g-import-not-at-top
from spade.agent import prompts as agent_prompts  # pylint: disable=g-import-not-at-top
from spade.environments import ladder  # pylint: disable=g-import-not-at-top
from spade.environments import library  # pylint: disable=g-import-not-at-top
from spade.model import transformer  # pylint: disable=g-import-not-at-top
from spade.selfplay import batching  # pylint: disable=g-import-not-at-top
from spade.selfplay import engine as engine_lib  # pylint: disable=g-import-not-at-top
from spade.selfplay import loop  # pylint: disable=g-import-not-at-top
from spade.selfplay import play_phase  # pylint: disable=g-import-not-at-top
from spade.train import lora  # pylint: disable=g-import-not-at-top
from spade.train import modes  # pylint: disable=g-import-not-at-top
from spade.train import state as state_lib  # pylint: disable=g-import-not-at-top

ARMS = curriculum_config.ARMS
LEVELS = ladder.LEVELS
# The agent's warm start: this many random replies of 16 letters a level,
# so each letter is right about 1 time in 4 (frontier 0).
RANDOM_REPLIES = 16


def note(fmt: str, *args) -> None:
  """The experiment's own line (the loop's are muted while an arm runs)."""
  print(
      "curriculum: " + (fmt % args if args else fmt),
      file=sys.stderr,
      flush=True,
  )


def agent_prompt(engine, config, level: int) -> list[int]:
  """The agent's first prompt at `level`, as the rollout renders it."""
  return agent_prompts.truncate_messages(
      agent_prompts.history_messages(
          ladder.observation(level), None, [], style=config.agent.prompt_style
      ),
      engine.render,
      engine.prompt_budget("agent"),
  )


@functools.lru_cache(maxsize=None)
def _forward(model, role):
  """The jitted full forward of `role`'s head (logits of every position)."""

  def fn(params, tokens, positions, mask):
    logits, _ = model.apply(
        lora.variables(params), tokens, positions, role, input_mask=mask
    )
    return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)

  return jax.jit(fn)


def continuation_logprobs(engine, role, prompts, continuations) -> np.ndarray:
  """log P(continuation | prompt) per pair, teacher-forced: float64[N, T]
  of each continuation token's log-probability (0 past its end)."""
  rows = [list(p) + list(c) for p, c in zip(prompts, continuations)]
  width = max(len(r) for r in rows)
  width = -(-width // 64) * 64  # a few shapes compile, not one per call
  tokens = np.zeros((len(rows), width), np.int32)
  mask = np.zeros((len(rows), width), bool)
  for i, r in enumerate(rows):
    tokens[i, : len(r)], mask[i, : len(r)] = r, True
  positions = np.broadcast_to(np.arange(width, dtype=np.int32), tokens.shape)
  logp = np.asarray(
      _forward(engine.model, role)(
          engine.state.params, tokens, positions, mask
      ),
      np.float64,
  )
  out = np.zeros((len(rows), max(len(c) for c in continuations)))
  for i, (p, c) in enumerate(zip(prompts, continuations)):
    for t, tok in enumerate(c):
      out[i, t] = logp[i, len(p) + t - 1, tok]
  return out


def win_probabilities(engine, config) -> dict[int, float]:
  """The agent's exact unhinted win probability at every level: P(a reply
  sampled at `agent.temperature` starts with the secret's first L letters),
  from its log-probabilities teacher-forced over them after the level's
  prompt."""
  a = config.agent
  if a.top_k or a.top_p < 1.0 or a.temperature != 1.0:
    raise ValueError(
        "the exact win probability is that of the whole distribution at"
        f" temperature 1; got agent.temperature={a.temperature},"
        f" top_k={a.top_k}, top_p={a.top_p}"
    )
  secret = engine.tokenizer.encode(ladder.SECRET)
  lp = continuation_logprobs(
      engine,
      transformer.Role.AGENT,
      [agent_prompt(engine, config, lv) for lv in LEVELS],
      [secret[:lv] for lv in LEVELS],
  )
  return {lv: float(np.exp(lp[i].sum())) for i, lv in enumerate(LEVELS)}


def frontier(probs: dict[int, float]) -> int:
  """The highest level won with probability >= 0.5 (0: none)."""
  return max([lv for lv, p in probs.items() if p >= 0.5], default=0)


def level_distribution(trainer) -> dict[int, float]:
  """The designer head's exact distribution over the level it writes:
  P(`L = <level>` then a line end | the design prompt), renormalised over
  the ladder's levels (the prompt is the same for every design)."""
  e = trainer.engine
  prompt = engine_lib._folder_rows(e, trainer.config.train.warm_start_dir)[0]  # pylint: disable=protected-access
  head = list(prompt.prompt_ids) + e.tokenizer.encode("L = ")
  lp = continuation_logprobs(
      e,
      transformer.Role.DESIGNER,
      [head] * len(LEVELS),
      [e.tokenizer.encode(f"{lv}\n") for lv in LEVELS],
  )
  p = np.exp(lp.sum(1))
  p = p / p.sum()
  return {lv: float(x) for lv, x in zip(LEVELS, p)}


def mixed_share(scores) -> float:
  """The share of played environments whose unhinted returns differ (the
  groups whose advantages are not all 0: the ones that carry signal)."""
  mixed = []
  for e in range(scores.returns.shape[0]):
    r = scores.returns[e, :, 0][scores.mask[e, :, 0]]
    if r.size:
      mixed.append(float(r.min() != r.max()))
  return float(np.mean(mixed)) if mixed else 0.0


class _Counting:
  """Wraps `play_phase.play` to count each iteration's agent episodes and
  tokens by arm (hinted or not); the loop itself is unchanged."""

  def __init__(self):
    self.rows = []
    self._play = play_phase.play

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

    play_phase.play = counted
    return self

  def __exit__(self, *exc):
    play_phase.play = self._play


class CurriculumTrainer(loop.Trainer):
  """The loop's Trainer, plus the exact win probabilities after every
  iteration, the levels played, the designs' rewards and the designer's
  level distribution (measurement only: it trains nothing). With
  `scripted`, its fixed pool is the one program just above the measured
  frontier, chosen afresh every iteration."""

  def __init__(self, config, workdir, warm=None, scripted=False):
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
          keep_reference=state_lib.keeps_reference(config),
      )
    self.scripted = scripted
    self.label = os.path.basename(workdir)
    self.probs = win_probabilities(self.engine, config)
    self.trace = []
    self._played = {}
    self._full_pool = None

  def _scripted_pool(self):
    """The fixed pool's program just above the measured frontier."""
    if self._full_pool is None:
      self._full_pool = play_phase.pool_programs(
          self.config, self.envs, library.train_programs()
      )
    target = min(frontier(self.probs) + 1, LEVELS[-1])
    return tuple(
        e for e in self._full_pool if ladder.level_of(e.source) == target
    )

  def _save_programs(self, played):
    scores = played.scores
    self._played = {
        "played_levels": [
            ladder.level_of(e.source) for e in played.window.envs
        ],
        "mixed_share": mixed_share(scores),
        # Each valid design's (level, designer reward) as the window scored
        # it, and whether it kept the family's secret.
        "design_rewards": [
            (
                ladder.level_of(d.code),
                float(scores.design_reward[d.index]),
                ladder.keeps_secret(d.code),
            )
            for d in played.designs
            if d.valid
        ],
    }
    return super()._save_programs(played)

  def step(self, it):
    if self.scripted:
      self.state = self.state.replace(pool=self._scripted_pool())
    m = super().step(it)
    designed = self.played.designs
    self.probs = win_probabilities(self.engine, self.config)
    designer = modes.get(self.config).designs
    row = {
        "iteration": it + 1,
        "win_probs": self.probs,
        "frontier": frontier(self.probs),
        **self._played,
        "design_levels": [ladder.level_of(d.code) for d in designed if d.valid],
        "designs": len(designed),
        "designer_tokens": sum(len(d.completion_ids) for d in designed),
        "designer_rows": m.get("update/designer_rows", 0.0),
        "agent_rows": m.get("update/agent_rows", 0.0),
        "return_nohint": m.get("agent/return_nohint"),
        "return_hint": m.get("agent/return_hint"),
        "regret": m.get("regret/mean"),
        "designer_reward": m.get("designer/reward_mean", 0.0),
        "level_probs": level_distribution(self) if designer else None,
        "seconds": m.get("time/iteration_s"),
    }
    self.trace.append(row)
    note(
        "  %s iter %d/%d: played %s, mixed %.2f, frontier %d (P %s) %.1f s",
        self.label,
        it + 1,
        self.config.num_iterations,
        "".join(_level_char(lv) for lv in sorted(row["played_levels"])),
        row["mixed_share"],
        row["frontier"],
        " ".join(f"{self.probs[lv]:.2f}" for lv in LEVELS[:8]),
        m.get("time/iteration_s") or 0.0,
    )
    return m


def _level_char(level) -> str:
  """One character a level (1-9, then a-g) for the progress lines."""
  if level is None:
    return "?"
  return "123456789abcdefg"[level - 1] if 1 <= level <= 16 else "?"


def agent_rows(
    engine,
    config,
    seed: int,
    replies: int = RANDOM_REPLIES,
    known: int = 0,
    full: bool = True,
    stuck: bool = False,
):
  """Supervised agent rows: `replies` random strings of 16 letters at every
  level (drawn from `seed`, never favouring the secret); with `known`, each
  starts with the secret's first `known` letters instead (an agent at
  frontier `known`, tests/learning/test_curriculum.py), and with `stuck`
  the letter after them is always the same wrong one (it never wins level
  `known` + 1 without the hint).

  Every reply is long enough for the top level: a reply that stops after
  L letters has its end-of-reply token reinforced by every win at level L,
  and that stop is what the next rung must first unlearn (a pilot with
  replies of L letters at level L stalled at level 3: P(letter 3) fell
  to 0.02 while level 2 was learned)."""
  rng = np.random.default_rng(10_000 + seed)
  eos = [engine.tokenizer.eos_id]
  rows = []
  for level in LEVELS:
    prompt = agent_prompt(engine, config, level)
    for _ in range(replies):
      length = len(ladder.SECRET) if full else max(level, known)
      tail = rng.choice(list(ladder.ALPHABET), length - known)
      reply = ladder.SECRET[:known] + "".join(tail)
      if stuck:
        right = ladder.SECRET[known]
        wrong = next(c for c in ladder.ALPHABET if c != right)
        reply = reply[:known] + wrong + reply[known + 1 :]
      rows.append(
          batching.Row(prompt, engine.tokenizer.encode(reply) + eos, [], 1.0)
      )
  return rows


def warm_params(
    seed: int,
    steps: int,
    workdir: str,
    lr: float,
    known=0,
    full=True,
    stuck=False,
):
  """The warm start; every arm of every seed starts from its parameters
  (on the host). The designer learns the ladder's programs
  (`train.warm_start_dir`, each level once), the agent random replies of
  each level's length (`agent_rows`)."""
  c = curriculum_config.get_config("spade")
  c.seed = seed
  c.optim.learning_rate = lr
  start = time.time()
  with console.muted():
    t = loop.Trainer(c, workdir)
    e = t.engine
    designer = engine_lib._folder_rows(e, c.train.warm_start_dir)  # pylint: disable=protected-access
    agent = agent_rows(e, c, seed, known=known, full=full, stuck=stuck)
    e._warm_start_rows(designer, agent, steps)  # pylint: disable=protected-access
  note("  warm start: %d steps in %.0f s", steps, time.time() - start)
  params = jax.device_get(e.state.params)
  t.envs.close()
  return params


def cached_warm_params(folder, seed, steps, workdir, lr, full=True):
  """`warm_params`, kept in `folder` (when given) and reused from it."""
  import pickle  # pylint: disable=g-import-not-at-top

  name = f"warm_s{seed}_n{steps}_lr{lr}_{'full' if full else 'level'}.pkl"
  path = folder and os.path.join(folder, name)
  if path and os.path.exists(path):
    with open(path, "rb") as f:
      return pickle.load(f)
  params = warm_params(seed, steps, workdir, lr, full=full)
  if path:
    os.makedirs(folder, exist_ok=True)
    with open(path, "wb") as f:
      pickle.dump(params, f)
  return params


def run_arm(arm, seed, iterations, workdir, warm, overrides=()):
  """Trains one arm from the `warm` parameters; returns its start (win
  probabilities, frontier, designer level distribution), its trace and its
  compute."""
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
    t = CurriculumTrainer(c, workdir, warm, scripted=arm == "scripted")
    start = {
        "win_probs": t.probs,
        "frontier": frontier(t.probs),
        "level_probs": level_distribution(t) if modes.get(c).designs else None,
    }
    t.run()
  played = collections.Counter()
  for row in counts.rows:
    played.update(row)
  compute = {
      "agent_episodes": played["unhinted_episodes"],
      "agent_tokens": played["unhinted_tokens"],
      "agent_update_rows": sum(r["agent_rows"] for r in t.trace),
      "hinted_episodes": played["hinted_episodes"],
      "hinted_tokens": played["hinted_tokens"],
      "designer_tokens": sum(r["designer_tokens"] for r in t.trace),
      "designer_update_rows": sum(r["designer_rows"] for r in t.trace),
      "wall_s": time.time() - t0,
  }
  return {"start": start, "trace": t.trace, "compute": compute}


def score(run: dict) -> float:
  """An arm's score on one seed: its mean frontier over the iterations."""
  return float(np.mean([r["frontier"] for r in run["trace"]]))


def plots(results: dict, folder: str) -> list[str]:
  """PNGs: per arm, the levels played per iteration with the frontier
  over them; the frontier per arm with its spread over seeds."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  written = []
  arms = [a for a in ARMS if results.get(a)]
  fig, axes = plt.subplots(
      1, len(arms), figsize=(3.0 * len(arms), 3.4), squeeze=False
  )
  for ax, arm in zip(axes[0], arms):
    runs = list(results[arm].values())
    n_it = len(runs[0]["trace"])
    dist = np.zeros((len(LEVELS), n_it))
    for run in runs:
      for i, row in enumerate(run["trace"]):
        for lv in row["played_levels"]:
          if lv in LEVELS:
            dist[LEVELS.index(lv), i] += 1
    dist /= np.maximum(dist.sum(0, keepdims=True), 1)
    ax.imshow(
        dist, origin="lower", aspect="auto", cmap="Blues", vmin=0, vmax=0.5,
        extent=(0.5, n_it + 0.5, LEVELS[0] - 0.5, LEVELS[-1] + 0.5),
    )  # fmt: skip
    for run in runs:
      ax.plot(
          range(0, n_it + 1),
          [run["start"]["frontier"]] + [r["frontier"] for r in run["trace"]],
          color="tab:red", alpha=0.6,
      )  # fmt: skip
    ax.set_title(arm)
    ax.set_xlabel("iteration")
    ax.set_ylim(-0.5, LEVELS[-1] + 0.5)
  axes[0][0].set_ylabel("level (played: blue; frontier: red)")
  fig.tight_layout()
  path = os.path.join(folder, "levels_and_frontier.png")
  fig.savefig(path, dpi=90)
  plt.close(fig)
  written.append(path)

  fig, ax = plt.subplots(figsize=(6, 4))
  for arm in arms:
    curves = np.array(
        [
            [run["start"]["frontier"]] + [r["frontier"] for r in run["trace"]]
            for run in results[arm].values()
        ],
        float,
    )
    x = np.arange(curves.shape[1])
    mean, lo, hi = curves.mean(0), curves.min(0), curves.max(0)
    ax.plot(x, mean, label=arm)
    ax.fill_between(x, lo, hi, alpha=0.15)
  ax.set_xlabel("iteration")
  ax.set_ylabel("frontier (mean; band: min-max over seeds)")
  ax.legend()
  fig.tight_layout()
  path = os.path.join(folder, "frontier.png")
  fig.savefig(path, dpi=90)
  plt.close(fig)
  written.append(path)
  return written


def summary_line(results: dict) -> str:
  """`spade=... regret=... ... gap_uniform=... gap_frozen=... se=...`."""
  scores = {
      arm: {s: score(run) for s, run in results.get(arm, {}).items()}
      for arm in ARMS
  }
  parts = [
      f"{arm}={np.mean(list(scores[arm].values())):.3f}"
      if scores[arm]
      else f"{arm}=nan"
      for arm in ARMS
  ]
  ses = []
  for other in ("uniform", "frozen"):
    seeds = sorted(set(scores["spade"]) & set(scores[other]))
    diffs = np.array([scores["spade"][s] - scores[other][s] for s in seeds])
    if diffs.size:
      parts.append(f"gap_{other}={diffs.mean():.3f}")
      ses.append(
          diffs.std(ddof=1) / np.sqrt(diffs.size) if diffs.size > 1 else np.nan
      )
    else:
      parts.append(f"gap_{other}=nan")
  se = max(ses) if ses else float("nan")
  return " ".join(parts) + f" se={se:.3f}"


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--arms", default=",".join(ARMS))
  p.add_argument("--seeds", type=int, default=4)
  p.add_argument("--iterations", type=int, default=16)
  p.add_argument("--warm_start_steps", type=int, default=600)
  p.add_argument("--warm_start_lr", type=float, default=5e-3)
  p.add_argument(
      "--set",
      action="append",
      default=[],
      help="KEY=VALUE config override for every arm (a Python literal)",
  )
  p.add_argument(
      "--agent_replies",
      default="full",
      choices=("full", "level"),
      help="the agent's warm-start replies: 16 random letters, or L at level L",
  )
  p.add_argument(
      "--warm_dir",
      default="",
      help="keep each seed's warm start here and reuse it when present",
  )
  p.add_argument("--out", default="")
  args = p.parse_args(argv)
  console.quiet(verbose=False)
  out = args.out or tempfile.mkdtemp(prefix="spade-curriculum-")
  os.makedirs(out, exist_ok=True)
  note("writing to %s", out)
  import ast  # pylint: disable=g-import-not-at-top

  overrides = [
      (k, ast.literal_eval(v)) for k, v in (s.split("=", 1) for s in args.set)
  ]
  arms = [a for a in args.arms.split(",") if a]
  results: dict = {a: {} for a in arms}
  t0 = time.time()
  done, total = 0, args.seeds * len(arms)
  note("warm start (%d steps)", args.warm_start_steps)
  warm = cached_warm_params(
      args.warm_dir,
      0,
      args.warm_start_steps,
      os.path.join(out, "warm"),
      args.warm_start_lr,
      args.agent_replies == "full",
  )
  for seed in range(args.seeds):
    for arm in arms:
      res = run_arm(
          arm,
          seed,
          args.iterations,
          os.path.join(out, f"{arm}_{seed}"),
          warm,
          overrides,
      )
      results[arm][seed] = res
      done += 1
      elapsed = time.time() - t0
      note(
          "seed %d, %s: mean frontier %.2f (final %d); %d/%d runs in %.0f s,"
          " ETA %.0f s",
          seed, arm, score(res), res["trace"][-1]["frontier"], done, total,
          elapsed, elapsed / done * (total - done),
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
