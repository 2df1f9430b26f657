"""The SPADE host loop: design, validate, play, score, update, remember, save.

One iteration (see DESIGN.md); each phase makes typed records
(`spade.selfplay.records`) that the next phase reads and never edits:

  1. design    grounding documents + memory examples -> prompts -> sampled
               programs (designer head) -> `Verdict`s from the sandbox ->
               hints written for valid programs (before archiving, so a
               replay keeps them) -> archived (near-duplicates rejected) ->
               `Design`s.
  2. play      `Environment`s (new valid designs, archive replays, the fixed
               pool or seed programs) -> K episodes without and K with the
               hint each, all advancing together -> `Episode`s; a failed
               play is played once more, and a program whose play hung is
               not played again in the run.
  3. score     returns R[env, k, hinted] -> `Scores`: regret, designer
               rewards and advantages, in one jitted function
               (spade.regret.scoring).
  4. update    rows with signal only (advantage != 0), weighted to make the
               reference's batch of `optim.global_batch_size` samples
               (`score.update_rows`) -> one jitted, sharded, donated update
               of the shared parameters (spade.train.update); designer rows
               wait `optim.designer_delay` iterations in the loop state; an
               iteration without signal skips the update.
  5. memory, metrics (metrics.jsonl + TensorBoard), programs and verdicts
     under WORKDIR/programs/iter_NNNNNN/, and an orbax checkpoint of the whole
     state (train state + loop state) every `train.checkpoint_every`
     iterations.

`train.mode="fixed_pool"` is the baseline: no designer; the agent plays the
programs of `train.pool_dir` (or the seed library) with the same compute.
`train.mode="adaptive"` plays a levelled family (`train.family`) at each
environment's sliding-window level, unhinted (`spade.selfplay.adaptive`).

Starting again on the same workdir resumes from the newest checkpoint.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from absl import logging
import jax
import ml_collections
import tqdm

from spade import console
from spade.environments import library
from spade.eval import runner as eval_runner
from spade.selfplay import curriculum as curriculum_lib
from spade.selfplay import design as design_lib
from spade.selfplay import engine as engine_lib
from spade.selfplay import executor as executor_lib
from spade.selfplay import metrics as metrics_lib
from spade.selfplay import play as play_lib
from spade.selfplay import records
from spade.selfplay import report
from spade.selfplay import score as score_lib
from spade.train import checkpoints

PROGRAMS_DIR = "programs"
# One JSON line per episode played in an iteration (`train.save_episodes`).
EPISODES_FILE = "episodes.jsonl"


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
    self.state = curriculum_lib.LoopState(config)
    self.start = 0
    restored = checkpoints.restore_latest(
        self.manager, checkpoints.abstract_like(self.engine.state)
    )
    if restored is not None:
      step, state, loop_state = restored
      self.engine.state = state
      self.state.load(loop_state)
      self.start = step
      self.writer.drop_after(step)
      console.say("resumed from %s at iteration %d", workdir, step)
    self.seeds = [
        p for p in library.seed_programs() if not getattr(p, "heldout", False)
    ]
    self._pool_programs = None
    # This iteration's designs and what each earned, for the run's summary
    # (`report`).
    self.designed: list[records.Design] = []
    self.earned: dict[int, dict[str, float | None]] = {}

  # -- phases ---------------------------------------------------------------

  def pool_programs(self) -> list[records.Environment]:
    """The fixed pool (`play.pool_programs`), validated once per run."""
    if self._pool_programs is None:
      self._pool_programs = play_lib.pool_programs(
          self.config, self.envs, self.seeds
      )
    return self._pool_programs

  def update(
      self, it, agent_rows, designer_rows, samples: int = 0
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
    out = self.engine.update(agent_rows, designer_rows, samples)
    out["train/update_skipped"] = 0.0
    return out, time.perf_counter() - t

  # -- one iteration ----------------------------------------------------------

  def iteration(self, it: int) -> dict[str, float]:
    """Runs iteration `it` and returns its metrics.

    In "spade" mode the designer regenerates the pool every
    `designer.regeneration_interval` iterations (the reference's 4) and the
    agent plays it with and without hints then; in between it plays the
    same pool without hints. When the window closes, the designer's rewards
    come from every play of the window, and its rows go to the update
    (after `optim.designer_delay` more iterations).
    """
    c, t_start = self.config, time.perf_counter()
    prefill = self.engine.prefill_counts()
    window = self.state.window
    designed = design_lib.Designed([], records.Timings(), {})
    if window is None:
      if c.train.mode == "spade":
        designed = design_lib.design(c, self.engine, self.envs, self.state, it)
      envs = play_lib.environments(
          c, self.state, it, designed.designs, self.pool_programs
      )
      window = records.Window(
          it, envs, designed.designs, [[[], []] for _ in envs]
      )
    envs = window.envs
    episodes, stats = play_lib.play(
        c,
        self.engine,
        self.envs,
        it,
        envs,
        hinted_arm=window.start == it,
        skip=self.state.hung_indices(envs),
    )
    # Per environment: whether a play of it hung (an environment call past
    # its budget), for the blacklist and the window's timeout penalty.
    timed_out = score_lib.timed_out(len(envs), episodes)
    self.state.blacklist_hung(envs, timed_out)
    scores = score_lib.score(c, [], envs, *score_lib.returns(c, envs, episodes))
    self.state.update_difficulty(scores)  # adaptive mode: windows learn
    agent_samples, total = score_lib.agent_samples(c, episodes, scores)
    compact = {}
    if c.agent.compact_filter:
      filtered, trainable = score_lib.compact_filtered(c, episodes)
      compact = {
          "rollout/compact_filtered_count": float(filtered),
          "rollout/compact_filtered_pct": filtered / max(trainable, 1),
      }
    window = window.with_plays(scores.returns, scores.mask, timed_out)
    if window.start == it:
      self.state.remember_regeneration(it, window, scores)
    interval = (
        c.designer.regeneration_interval if c.train.mode == "spade" else 1
    )
    # The last iteration closes an open window and trains every delayed
    # designer row (the reference's flush at its final rollout,
    # `optim.flush_designer_rows`), so no design's rows are lost.
    flush = c.optim.flush_designer_rows and it + 1 >= c.num_iterations
    closes = flush or it + 1 - window.start >= max(1, interval)
    # Regret, designer rewards and memory stats: over the window's plays.
    window_scores = score_lib.score(c, window.designs, envs, *window.arrays())
    designer_samples = []
    if closes:
      window_scores, self.state.lp = score_lib.window_rewards(
          c, window, window_scores, total, self.state.lp
      )
      designer_samples = score_lib.designer_samples(
          window.designs, window_scores
      )
      total += len(window.designs)
      self._remember(it, envs, window_scores)
    self.state.window = None if closes else window
    due = self.state.delay_designer_rows(
        it, designer_samples, c.optim.designer_delay, flush=flush
    )
    # The batch of `optim.global_batch_size` samples: designs first, agent
    # episodes duplicated or trimmed by copy counts.
    agent_rows, due_rows, samples, shaping = score_lib.update_rows(
        c, agent_samples, due, total
    )
    update_metrics, update_s = self.update(it, agent_rows, due_rows, samples)
    self._save_programs(
        it, designed.designs, envs, scores, window_scores, episodes
    )
    self.designed = designed.designs
    self.earned = _earned(designed.designs, envs, scores, window_scores)
    timings = designed.timings + records.Timings(
        stats.sampling_s, stats.sandbox_s, update_s
    )
    return metrics_lib.iteration_metrics(
        designs=designed.designs,
        window=window,
        envs=envs,
        episodes=episodes,
        scores=scores,
        window_scores=window_scores,
        stats=stats,
        hinted_arm=any(ep.hinted for ep in episodes),
        closes=closes,
        rows=(
            len(agent_rows),
            len(due_rows),
            sum(map(len, agent_samples))
            + sum(r is not None for r in designer_samples),
            total,
        ),
        timings=timings,
        seconds=time.perf_counter() - t_start,
        prefill=tuple(
            b - a for a, b in zip(prefill, self.engine.prefill_counts())
        ),
        extra={
            **designed.metrics,
            **update_metrics,
            **shaping,
            **self.state.metrics(
                replayed=sum(e.origin == "replay" for e in envs),
                total=len(envs),
            ),
            "designer/diversity": self.state.diversity(
                [d.code for d in designed.designs]
            ),
            **compact,
        },
    )

  def _remember(self, it, envs, scores: records.Scores) -> None:
    """Archive stats of every archived environment played."""
    for e, env in enumerate(envs):
      if env.archive_id is None:
        continue
      m = scores.mask[e]
      self.state.update_stats(
          env.archive_id,
          iteration=it,
          regret=float(scores.regret[e]),
          win_rate_hint=_arm_mean(scores, e, 1) or 0.0,
          win_rate_nohint=_arm_mean(scores, e, 0) or 0.0,
          episodes=int(m.sum()),
      )

  def _save_programs(
      self, it, designs, envs, scores, window_scores, episodes=()
  ):
    if not self.config.train.save_programs or jax.process_index() != 0:
      return
    folder = self._programs_folder(it)
    os.makedirs(folder, exist_ok=True)
    if self.config.train.save_episodes:
      rule = self.config.agent.return_rule
      with open(os.path.join(folder, EPISODES_FILE), "w") as f:
        for ep in episodes:
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
              "reward_so_far": float(window_scores.design_reward[d.index]),
          }
      )
    played = [
        {
            "origin": env.origin,
            "design_index": env.design_index,
            "archive_id": env.archive_id,
            "name": env.name,
            "return_nohint": _arm_mean(scores, e, 0),
            "return_hint": _arm_mean(scores, e, 1),
        }
        for e, env in enumerate(envs)
    ]
    with open(os.path.join(folder, "verdicts.json"), "w") as f:
      json.dump({"designs": index, "played": played}, f, indent=1)

  # -- the run ---------------------------------------------------------------

  def run(self) -> None:
    c = self.config
    if self.start == 0 and c.train.warm_start_steps > 0:
      self.engine.warm_start(self.seeds, c.train.warm_start_steps)
    bar = tqdm.tqdm(
        range(self.start, c.num_iterations),
        initial=self.start,
        total=c.num_iterations,
        desc="spade",
        unit="it",
        disable=jax.process_index() != 0 or console.is_muted(),
    )
    for it in bar:
      m = self.iteration(it)
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
            self.manager, step, self.engine.state, self.state.state()
        )
        self.state.write_memory_file(self.workdir)
    self.writer.close()
    self.envs.close()
    if jax.process_index() == 0:
      folder, example = self._programs_folder(c.num_iterations - 1), None
      if folder and not os.path.isdir(folder):
        folder = None
      for d in self.designed:
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
    rows = report.design_rows(
        self.designed, self.config.memory.duplicate_threshold, self.earned
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


def _earned(designs, envs, scores, window_scores):
  """Design index -> its environment's mean returns without and with the
  hint this iteration, its regret and its designer reward so far."""
  out = {}
  for e, env in enumerate(envs):
    if env.design_index is None or env.design_index >= len(designs):
      continue
    out[env.design_index] = {
        "return_nohint": _arm_mean(scores, e, 0),
        "return_hint": _arm_mean(scores, e, 1),
        "regret": float(window_scores.regret[e]),
        "reward": float(window_scores.design_reward[env.design_index]),
    }
  return out


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


def _arm_mean(scores: records.Scores, e: int, h: int) -> float | None:
  """Mean return of environment e's arm h over its unmasked episodes."""
  m = scores.mask[e, :, h]
  return float(scores.returns[e, :, h][m].mean()) if m.any() else None


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Runs (or resumes) SPADE with `config` in `workdir`."""
  Trainer(config, workdir).run()
