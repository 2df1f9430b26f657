"""The SPADE host loop: design, validate, play, score, update, remember, save.

`state, metrics = iteration(config, engine, executor, state, it)` runs one
iteration (see docs/architecture.md): the loop state
(`spade.selfplay.state.LoopState`) goes in, a new one comes out, and each
phase takes records (`spade.selfplay.records`) and returns records; none
assigns to the state (the memory's stores change in place, through the
state's methods: `spade.selfplay.state` lists which):

  1. pool      a new window: grounding documents + memory examples ->
               prompts -> programs (designer head) -> `Verdict`s from the
               sandbox -> hints for valid programs (before archiving, so a
               replay keeps them) -> archived (near-duplicates rejected) ->
               `Design`s (`design.design`); then the `Environment`s (new
               valid designs, archive replays, the fixed pool or seed
               programs, `play_phase.environments` -> `Drawn`). Between
               regenerations the open window's pool, topped up to
               `designer.num_envs` by the same design phase, unhinted
               (`designer.top_up`, the reference's).
  2. play      K episodes without and, at regeneration, K with the hint per
               environment, all advancing together -> `Episode`s
               (`play_phase.play`); their returns f32[E, K, 2] become the
               window's next step, R[E, S, K, 2] (`Window.with_plays`).
  3. score     the window -> `Scores` in one jitted call
               (`score.score`, `spade.regret.scoring`): the agent's
               advantages of this iteration's plays; regret, designer
               rewards and, when the window closes, its registered window
               reward over every play of the window. A top-up's
               designer rows are made when it is designed
               (`score.top_up_samples`).
  4. update    rows with signal only (advantage != 0), weighted to make the
               reference's batch of `optim.global_batch_size` samples
               (`score.update_rows`) -> one jitted, sharded, donated update
               of the shared parameters (spade.train.update); designer rows
               wait `optim.designer_delay` iterations in the loop state; an
               iteration without signal skips the update.
  5. the next state (window, delayed rows, blacklist, trackers, difficulty
     windows), memory stats, and the metrics row. `Trainer` writes
     metrics.jsonl + TensorBoard, programs and verdicts under
     WORKDIR/programs/iter_NNNNNN/, and an orbax checkpoint of the whole
     state (train state + loop state) every `train.checkpoint_every`
     iterations.

`train.mode` (`spade.train.modes`): "fixed_pool" is the baseline, no
designer, the agent plays the programs of `train.pool_dir` (or the seed
library) with the same compute; "adaptive" plays a levelled family
(`train.family`) at each environment's sliding-window level, unhinted
(`spade.selfplay.adaptive`).

Starting again on the same workdir resumes from the newest checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Callable

from absl import logging
import jax
import ml_collections
import numpy as np
import tqdm

from spade import console
from spade.environments import library
from spade.eval import runner as eval_runner
from spade.selfplay import adaptive
from spade.selfplay import design as design_lib
from spade.selfplay import engine as engine_lib
from spade.selfplay import executor as executor_lib
from spade.selfplay import metrics as metrics_lib
from spade.selfplay import play_phase
from spade.selfplay import records
from spade.selfplay import report
from spade.selfplay import score as score_lib
from spade.selfplay import state as state_lib
from spade.train import checkpoints
from spade.train import modes

PROGRAMS_DIR = "programs"
# One JSON line per episode played in an iteration (`train.save_episodes`).
EPISODES_FILE = "episodes.jsonl"


@dataclasses.dataclass(frozen=True)
class Played:
  """One iteration's records, for its metrics and what the run writes
  beside them (programs, verdicts, episodes, the console's summary)."""

  it: int
  # A new pool's designs, a top-up's between regenerations, or none.
  designed: design_lib.Designed
  window: records.Window  # with this iteration's plays as its last step
  episodes: list[records.Episode]
  stats: Any  # the rollout's `RolloutStats`
  scores: records.Scores
  closes: bool  # the window closed: its designs' rows were made
  top_up_rewards: np.ndarray  # f32[N]: the top-ups' raw designer rewards

  @property
  def designs(self) -> list[records.Design]:
    return self.designed.designs

  @property
  def top_ups(self) -> list[records.Design]:
    """This iteration's designs when they topped up an open window."""
    return self.designs if self.window.start != self.it else []

  def design_reward(self, d: records.Design) -> float:
    """Design d's raw designer reward so far: a top-up's, or over the
    window's plays."""
    if self.top_ups:
      return float(self.top_up_rewards[d.index])
    return float(self.scores.design_reward[d.index])


def iteration(
    config: ml_collections.ConfigDict,
    engine,
    executor,
    state: state_lib.LoopState,
    it: int,
    *,
    on_played: Callable[[Played], None] | None = None,
) -> tuple[state_lib.LoopState, dict[str, float]]:
  """Runs iteration `it` from `state`; returns the next state and the
  iteration's metrics (`on_played`, when given, sees its records first).

  A pool is played over a window (`modes.window_length`: the designer's
  `regeneration_interval`), hinted at its first iteration; when the window
  closes, the designs' rewards come from every play of it and their rows
  join the update `optim.designer_delay` iterations later.
  """
  c, t_start, prefill = config, time.perf_counter(), engine.prefill_counts()
  designed, window, levels, state = _pool(c, engine, executor, state, it)
  envs = list(window.envs)
  episodes, stats = play_phase.play(
      c, engine, executor, it, envs, hinted_arm=window.start == it,
      skip=state.hung_indices(envs),
  )  # fmt: skip
  # Per environment: whether a play of it hung (an environment call past
  # its budget), for the blacklist and the window's timeout penalty.
  timed_out = score_lib.timed_out(len(envs), episodes)
  window = window.with_plays(*score_lib.returns(c, envs, episodes), timed_out)
  # The last iteration closes an open window and trains every delayed
  # designer row (the reference's flush at its final rollout,
  # `optim.flush_designer_rows`), so no design's rows are lost.
  flush = c.optim.flush_designer_rows and it + 1 >= c.num_iterations
  closes = flush or it + 1 - window.start >= modes.window_length(c)
  scores, lp = score_lib.score(c, window, state.lp, closes)
  agent_samples, total = score_lib.agent_samples(c, episodes, scores)
  designer_samples, raw = _designer_samples(
      c, it, designed, window, scores, closes, timed_out, total
  )
  if closes:
    state.remember_window(it, window, scores)
  total += len(designer_samples)
  if window.start == it:
    state.remember_regeneration(it, window, scores)
  due, queue = state.delay_designer_rows(
      it, designer_samples, c.optim.designer_delay, flush=flush
  )
  state = state.replace(
      window=None if closes else window, lp=lp, delayed=queue,
      hung=state.with_hung(envs, timed_out),
      difficulty=_difficulty(c, state.difficulty, levels, scores),
  )  # fmt: skip
  # The batch of `optim.global_batch_size` samples: designs first, agent
  # episodes duplicated or trimmed by copy counts.
  agent_rows, due_rows, samples, shaping = score_lib.update_rows(
      c, agent_samples, due, total
  )
  updated, update_s = update(engine, it, agent_rows, due_rows, samples)
  played = Played(it, designed, window, episodes, stats, scores, closes, raw)
  if on_played is not None:
    on_played(played)
  signal = sum(map(len, agent_samples)) + sum(
      r is not None and r.advantage != 0.0 for r in designer_samples
  )
  rows = (len(agent_rows), len(due_rows), signal, total)
  counts = tuple(b - a for a, b in zip(prefill, engine.prefill_counts()))
  seconds = time.perf_counter() - t_start
  return state, _metrics(
      played, state, rows, {**updated, **shaping}, update_s, counts, seconds
  )


def _pool(config, engine, executor, state, it):
  """The pool this iteration plays: the open window, or a new one (the
  designs, in "spade" mode, and the environments drawn). Returns (the
  design phase's `Designed`, the window, the (name, level) of each
  environment in adaptive mode, the state with the draw's cursor)."""
  designed = design_lib.Designed([], records.Timings(), {})
  if state.window is not None:
    return (*_top_up(config, engine, executor, state, it), [], state)
  if modes.get(config).designs:
    designed = design_lib.design(config, engine, executor, state, it)
  drawn = play_phase.environments(config, state, it, designed.designs, executor)
  window = records.Window.open(it, drawn.envs, designed.designs)
  state = state.replace(pool_cursor=drawn.pool_cursor, pool=drawn.pool)
  return designed, window, drawn.levels, state


def _designer_samples(
    config, it, designed, window, scores, closes, timed_out, actor_rows
):
  """The designer samples made this iteration (`delay_designer_rows` queues
  them): the closing window's designs' (`score.designer_samples`), then
  the designs that topped it up this iteration (`score.top_up_samples`);
  and the top-ups' raw rewards."""
  top_ups = designed.designs if window.start != it else []
  out, raw = score_lib.top_up_samples(config, top_ups, timed_out, actor_rows)
  if closes:
    out = score_lib.designer_samples(config, window, scores, actor_rows) + out
  return out, raw


def _top_up(config, engine, executor, state, it):
  """The open window, topped up (`designer.top_up`): the reference's
  `collect_trajectories` (spade/core/orchestrator.py lines 2299-2326), at a
  rollout that does not regenerate, generates the games its pool lacks
  (`min_games - len(game_files)`) and plays the valid ones from then on.
  Here the missing environments are designed with the same design phase,
  without hints (no hinted arm plays them), and the valid ones join the
  window from this step on. Returns (the top-up's `Designed`, the
  window)."""
  window = state.window
  missing = config.designer.num_envs - len(window.envs)
  if not (config.designer.top_up and modes.get(config).designs) or (
      missing <= 0
  ):
    return design_lib.Designed([], records.Timings(), {}), window
  console.say(
      "iteration %d: the pool holds %d of %d environments; designing %d more",
      it + 1, len(window.envs), config.designer.num_envs, missing,
  )  # fmt: skip
  designed = design_lib.design(
      config, engine, executor, state, it, count=missing, hints=False
  )
  envs = play_phase.top_up_environments(designed.designs)
  return designed, window.with_envs(envs)


def _metrics(played, state, rows, updated, update_s, prefill, seconds):
  """The iteration's metrics.jsonl row (`metrics.iteration_metrics`)."""
  designed, window, stats = played.designed, played.window, played.stats
  return metrics_lib.iteration_metrics(
      designs=designed.designs,
      window=window,
      episodes=played.episodes,
      scores=played.scores,
      stats=stats,
      closes=played.closes,
      rows=rows,
      timings=designed.timings
      + records.Timings(stats.sampling_s, stats.sandbox_s, update_s),
      seconds=seconds,
      prefill=prefill,
      extra={
          **designed.metrics,
          **updated,
          **state.metrics(
              replayed=sum(e.origin == "replay" for e in window.envs),
              total=len(window.envs),
          ),
          "designer/diversity": state_lib.diversity(
              [d.code for d in designed.designs]
          ),
          "designer/top_up": float(len(played.top_ups)),
          **score_lib.compact_metrics(state.config, played.episodes),
      },
  )


def _difficulty(config, windows, levels, scores):
  """adaptive mode: the difficulty windows after this iteration's plays
  at `levels` (the others keep theirs)."""
  if not modes.get(config).levelled:
    return windows
  return adaptive.update(config, windows, levels, scores.returns, scores.mask)


def update(
    engine, it: int, agent_rows, designer_rows, samples: int = 0
) -> tuple[dict, float]:
  """One shared update on the rows with signal (skipped without any),
  `samples` the loss's divisor (`score.update_rows`); returns its metrics
  and seconds."""
  t = time.perf_counter()
  if not agent_rows and not designer_rows:
    console.say(
        "iteration %d: no row carries signal (every group's returns were"
        " equal); update skipped",
        it + 1,
    )
    return {"train/update_skipped": 1.0}, 0.0
  console.say(
      "iteration %d: update on %d agent and %d designer rows",
      it + 1,
      len(agent_rows),
      len(designer_rows),
  )
  out = engine.update(agent_rows, designer_rows, samples)
  out["train/update_skipped"] = 0.0
  return out, time.perf_counter() - t


class Trainer:
  """The run: the policy (`engine`), the environment executor (`envs`), the
  loop state (`state`); `run()` iterates to the end."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str):
    self.config = config
    self.workdir = workdir
    os.makedirs(workdir, exist_ok=True)
    if jax.process_index() == 0:
      with open(os.path.join(workdir, "config.json"), "w") as f:
        f.write(config.to_json_best_effort(indent=2))
    self.engine = engine_lib.Engine(config)  # the policy
    design_lib.check_prompt_budget(config, self.engine)
    self.envs = executor_lib.Executor(config)  # validation, episodes
    self.manager = checkpoints.make_manager(
        workdir, keep=config.train.keep_checkpoints
    )
    self.writer = metrics_lib.MetricWriter(workdir)
    self.state = state_lib.LoopState.create(config)
    self.start = 0
    restored = checkpoints.restore_latest(
        self.manager, checkpoints.abstract_like(self.engine.state)
    )
    if restored is not None:
      step, state, loop_state = restored
      self.engine.state = state
      self.state = self.state.restored(loop_state)
      self.start = step
      self.writer.drop_after(step)
      console.say("resumed from %s at iteration %d", workdir, step)
    # The last iteration's records, for the run's summary (`report`).
    self.played: Played | None = None

  def step(self, it: int) -> dict[str, float]:
    """Runs iteration `it`: the next loop state and the iteration's
    metrics; its programs are saved."""
    self.state, m = iteration(
        self.config, self.engine, self.envs, self.state, it,
        on_played=self._keep,
    )  # fmt: skip
    return m

  def _keep(self, played: Played) -> None:
    self.played = played
    self._save_programs(played)

  def _save_programs(self, played: Played):
    """WORKDIR/programs/iter_NNNNNN/: the designs, the verdicts and what
    each environment earned, and (`train.save_episodes`) every episode."""
    if not self.config.train.save_programs or jax.process_index() != 0:
      return
    it, designs, scores = played.it, played.designs, played.scores
    envs = played.window.envs
    folder = self._programs_folder(it)
    os.makedirs(folder, exist_ok=True)
    if self.config.train.save_episodes:
      rule = self.config.agent.return_rule
      with open(os.path.join(folder, EPISODES_FILE), "w") as f:
        for ep in played.episodes:
          f.write(json.dumps(_transcript(ep, envs[ep.env_index], rule)) + "\n")
    index = []
    for d in designs:
      name = f"design_{d.index:03d}.py"
      with open(os.path.join(folder, name), "w") as f:
        f.write(d.code)
      index.append(
          {
              "file": name,
              "verdict": d.verdict.to_dict(),
              "hint": d.hint,
              "archive_id": d.archive_id,
              "grounding_id": d.grounding_id,
              "reward_so_far": played.design_reward(d),
              "top_up": bool(played.top_ups),
          }
      )
    played_envs = [
        {
            "origin": env.origin,
            "design_index": env.design_index,
            "archive_id": env.archive_id,
            "name": env.name,
            "return_nohint": scores.arm_mean(e, 0),
            "return_hint": scores.arm_mean(e, 1),
        }
        for e, env in enumerate(envs)
    ]
    with open(os.path.join(folder, "verdicts.json"), "w") as f:
      json.dump({"designs": index, "played": played_envs}, f, indent=1)

  # -- the run ---------------------------------------------------------------

  def run(self) -> None:
    c = self.config
    if self.start == 0 and c.train.warm_start_steps > 0:
      self.engine.warm_start(library.train_programs(), c.train.warm_start_steps)
    bar = tqdm.tqdm(
        range(self.start, c.num_iterations),
        initial=self.start,
        total=c.num_iterations,
        desc="spade",
        unit="it",
        disable=jax.process_index() != 0 or console.is_muted(),
    )
    for it in bar:
      m = self.step(it)
      step = it + 1
      if c.eval.every and c.eval.suites and step % c.eval.every == 0:
        m.update(
            eval_runner.run_suites(
                c,
                self.engine.state.params,
                self.envs.pool,
                step,
                mesh=self.engine.mesh,
            )
        )
      self.writer.write(step, m)
      bar.set_postfix(
          valid=f"{m['designer/valid_rate']:.2f}",
          regret=f"{m['regret/mean']:.3f}",
          ret=f"{m['agent/return_nohint']:.2f}/{m['agent/return_hint']:.2f}",
      )
      self._report(it, m)
      logging.info(
          "iteration %d: sampling %.1fs sandbox %.1fs (%.1fs hidden) update"
          " %.1fs; valid %.2f regret %.3f return %.2f/%.2f; %d/%d rows with"
          " signal",
          step,
          m["time/sampling_s"],
          m["time/sandbox_s"],
          m["time/sandbox_hidden_s"],
          m["time/update_s"],
          m["designer/valid_rate"],
          m["regret/mean"],
          m["agent/return_nohint"],
          m["agent/return_hint"],
          m["train/rows_with_signal"],
          m["train/rows_total"],
      )
      if step % c.train.checkpoint_every == 0 or step == c.num_iterations:
        checkpoints.save(
            self.manager, step, self.engine.state, self.state.to_json()
        )
        self.state.write_memory_file(self.workdir)
    self.writer.close()
    self.envs.close()
    if jax.process_index() == 0:
      folder, example = self._programs_folder(c.num_iterations - 1), None
      if folder and not os.path.isdir(folder):
        folder = None
      for d in self.played.designs if self.played else []:
        if d.valid and folder:
          example = os.path.join(folder, f"design_{d.index:03d}.py")
          break
      plotted = os.path.isdir(os.path.join(self.workdir, report.PLOTS_DIR))
      for line in report.footer(
          self.workdir, folder, example, plotted
      ).splitlines():
        console.say(line)

  def _programs_folder(self, it: int) -> str | None:
    """WORKDIR/programs/iter_NNNNNN of iteration `it`, if programs are saved."""
    if not self.config.train.save_programs:
      return None
    return os.path.join(self.workdir, PROGRAMS_DIR, f"iter_{it:06d}")

  def _report(self, it: int, m: dict[str, float]) -> None:
    """Iteration `it`'s summary: on the console, in summary.md, plots."""
    if jax.process_index() != 0:
      return
    designs = self.played.designs if self.played else []
    rows = report.design_rows(
        designs,
        self.config.memory.duplicate_threshold,
        _earned(self.played) if self.played else {},
    )
    for line in report.iteration_lines(it + 1, rows, m):
      console.say(line)
    report.plots(self.workdir, metrics_lib.read_metrics(self.workdir))
    report.write_summary(
        self.workdir,
        it + 1,
        report.iteration_markdown(it + 1, rows, m, self._programs_folder(it)),
        title=f"SPADE run {self.workdir}",
    )
    report.write_html(self.workdir)


def _earned(played: Played) -> dict[int, dict[str, Any]]:
  """Design index -> its environment's mean returns without and with the
  hint this iteration, its regret, its designer reward so far and what it
  showed the agent first (an unhinted play's first observation)."""
  designs, scores, envs = played.designs, played.scores, played.window.envs
  shown = {}
  for ep in sorted(played.episodes, key=lambda ep: ep.hinted):
    if ep.first_observation and ep.env_index not in shown:
      shown[ep.env_index] = ep.first_observation
  if played.top_ups:
    # The valid top-ups are the window's last environments, in order.
    valid = [d.index for d in designs if d.valid]
    pairs = zip(valid, range(len(envs) - len(valid), len(envs)))
  else:
    pairs = [
        (env.design_index, e)
        for e, env in enumerate(envs)
        if env.design_index is not None and env.design_index < len(designs)
    ]
  return {
      i: {
          "return_nohint": scores.arm_mean(e, 0),
          "return_hint": scores.arm_mean(e, 1),
          "regret": float(scores.regret[e]),
          "reward": played.design_reward(designs[i]),
          "shows": shown.get(e),
      }
      for i, e in pairs
  }


def _transcript(
    ep: records.Episode, env: records.Environment, rule: str
) -> dict[str, Any]:
  """An episode as a researcher reads it: what was shown, said and paid."""
  return {
      "env_index": ep.env_index,
      "name": env.name,
      "hinted": ep.hinted,
      "sample": ep.sample,
      "seed": ep.seed,
      "hint": ep.hint,
      "first_observation": ep.first_observation,
      "turns": [
          {
              "action": t.action,
              "reward": t.reward,
              "observation": t.observation,
              "tool_results": list(t.tool_results),
          }
          for t in ep.turns
      ],
      "terminated": ep.terminated,
      "truncated": ep.truncated,
      "env_failed": ep.env_failed,
      "error": ep.error,
      "return": ep.episode_return(rule),
  }


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Runs (or resumes) SPADE with `config` in `workdir`."""
  Trainer(config, workdir).run()
