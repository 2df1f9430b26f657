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
               hint each, all advancing together -> `Episode`s.
  3. score     returns R[env, k, hinted] -> `Scores`: regret, designer
               rewards and advantages, in one jitted function
               (spade.regret.scoring).
  4. update    rows with signal only (advantage != 0) -> one jitted, sharded,
               donated update of the shared parameters (spade.train.update);
               designer rows wait `optim.designer_delay` iterations in the
               loop state; an iteration without signal skips the update.
  5. memory, metrics (metrics.jsonl + TensorBoard), programs and verdicts
     under WORKDIR/programs/iter_NNNNNN/, and an orbax checkpoint of the whole
     state (train state + loop state) every `train.checkpoint_every`
     iterations.

`train.mode="fixed_pool"` is the baseline: no designer; the agent plays the
programs of `train.pool_dir` (or the seed library) with the same compute.

Starting again on the same workdir resumes from the newest checkpoint.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import time
from typing import Any

from absl import logging
import jax
import ml_collections
import numpy as np
import tqdm

from spade import console
from spade.agent import prompts as rollout_prompts
from spade.agent import rollout
from spade.designer import extract
from spade.designer import prompts as designer_prompts
from spade.environments import library
from spade.eval import runner as eval_runner
from spade.regret import scoring as regret_scoring
from spade.selfplay import batching
from spade.selfplay import curriculum as curriculum_lib
from spade.selfplay import engine as engine_lib
from spade.selfplay import executor as executor_lib
from spade.selfplay import metrics as metrics_lib
from spade.selfplay import records
from spade.selfplay import report
from spade.train import checkpoints

PROGRAMS_DIR = "programs"
# One JSON line per episode played in an iteration (`train.save_episodes`).
EPISODES_FILE = "episodes.jsonl"


def _log(fmt: str, *args) -> None:
  """A progress line on process 0 (the phases can take minutes on a CPU)."""
  console.say(fmt, *args)


def _seed_for(*parts: Any) -> int:
  """A stable 31-bit seed from any parts (same on every process and run)."""
  digest = hashlib.sha256(repr(parts).encode()).digest()
  return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


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
      logging.info("resumed from %s at iteration %d", workdir, step)
    self.seeds = [
        p for p in library.seed_programs() if not getattr(p, "heldout", False)
    ]
    self._pool_programs = None
    self._warned_prompt_cut = False
    # This iteration's designs, for the run's summary (`report`).
    self.designed: list[records.Design] = []

  # -- phases ---------------------------------------------------------------

  def design(self, it: int, timer: dict) -> tuple[list[records.Design], dict]:
    """Samples, extracts, validates, hints and archives this iteration's
    programs; returns them as frozen `Design`s."""
    c = self.config
    group = max(1, c.designer.samples_per_prompt)
    num_prompts = max(1, c.designer.num_envs // group)
    docs = self.state.documents(num_prompts)
    prompts, groups, doc_ids, parents, skills = [], [], [], [], []
    mutate = np.random.default_rng(_seed_for(c.seed, it, "mutate"))
    skill_groups: dict[str, int] = {}
    for g, doc in enumerate(docs):
      examples = self.state.examples(doc, c.memory.num_examples)
      parent = None
      if mutate.random() < c.memory.mutation_fraction:
        parent = self.state.mutation_parent(_seed_for(c.seed, it, g))
      spec = designer_prompts.pick_prompt(
          c.designer,
          iteration=it,
          index=g,
          seed=c.seed,
          regen_interval=c.designer.regeneration_interval,
      )
      ids = self._designer_prompt(doc, examples, parent, spec)
      for _ in range(group):
        prompts.append(ids)
        # The reference centres designer rewards per skill.
        groups.append(skill_groups.setdefault(spec.skill, len(skill_groups)))
        doc_ids.append(getattr(doc, "id", None))
        parents.append(getattr(parent, "id", None))
        skills.append(spec.skill)
    _log(
        "iteration %d: designer sampling %d programs (up to %d tokens)",
        it + 1,
        len(prompts),
        c.designer.max_new_tokens,
    )
    samples: list = [None] * len(prompts)
    codes: list = [None] * len(prompts)
    verdicts: list = [None] * len(prompts)
    attempts = [0] * len(prompts)
    # The reference samples an invalid design afresh from the same prompt,
    # up to its attempt limit (`designer.max_attempts`), and keeps the first
    # valid one.
    todo = list(range(len(prompts)))
    for attempt in range(max(1, c.designer.max_attempts)):
      if not todo:
        break
      t = time.perf_counter()
      outs = self.engine.sample(
          [prompts[i] for i in todo],
          role="designer",
          max_new_tokens=c.designer.max_new_tokens,
          temperature=c.designer.temperature,
          seed=_seed_for(c.seed, it, "designer", attempt),
          progress=f"iteration {it + 1}: designer sampling",
      )
      seconds = time.perf_counter() - t
      timer["sampling"] += seconds
      tokens = sum(len(ids) for ids, _, _ in outs)
      logging.info(
          "iteration %d: sampled %d designer tokens in %.1fs (attempt %d)",
          it + 1,
          tokens,
          seconds,
          attempt + 1,
      )
      new_codes = [extract.extract_code(text) for _, _, text in outs]
      t = time.perf_counter()
      with console.heartbeat(
          f"iteration {it + 1}: validating {len(new_codes)} programs in the"
          f" sandbox (attempt {attempt + 1})"
      ):
        new_verdicts = [
            records.Verdict.from_dict(v) for v in self.envs.validate(new_codes)
        ]
      timer["sandbox"] += time.perf_counter() - t
      for i, out, code, verdict in zip(todo, outs, new_codes, new_verdicts):
        samples[i], codes[i], verdicts[i] = out, code, verdict
        attempts[i] = attempt
      todo = [i for i in todo if not verdicts[i].valid]
    _log(
        "iteration %d: %d/%d programs valid; reasons: %s",
        it + 1,
        sum(v.valid for v in verdicts),
        len(verdicts),
        ", ".join(sorted({v.reason for v in verdicts})),
    )
    # Hints are written before anything is archived, so the archive keeps
    # them with the program and a replay plays its hinted arm.
    verdicts = self._write_hints(it, codes, verdicts, timer)
    designs = []
    duplicates = 0
    for i, (code, verdict) in enumerate(zip(codes, verdicts)):
      entry_id, dup_of = self.state.archive_add(
          code, verdict.to_dict(), it, doc_ids[i], parent=parents[i]
      )
      if dup_of is not None:
        duplicates += 1
        verdict = verdict.rejected("duplicate", f"near-duplicate of {dup_of}")
      designs.append(
          records.Design(
              index=i,
              group=groups[i],
              prompt_ids=tuple(prompts[i]),
              completion_ids=tuple(samples[i][0]),
              logprobs=tuple(samples[i][1]),
              code=code,
              verdict=verdict,
              grounding_id=doc_ids[i],
              parent_id=parents[i],
              archive_id=entry_id,
              skill=skills[i],
              attempt=attempts[i],
          )
      )
    return designs, {
        "memory/duplicates_this_iter": float(duplicates),
        "designer/mutations": float(sum(p is not None for p in parents)),
        "designer/attempts_mean": float(np.mean(attempts)) + 1.0,
    }

  def _write_hints(
      self,
      it: int,
      codes: list[str],
      verdicts: list[records.Verdict],
      timer: dict,
  ) -> list[records.Verdict]:
    """Verdicts of valid programs with a written hint where one is needed.

    `designer.hint_source="writer"` (the reference: a separate hint pass for
    every program) writes one for each valid program; "program" (ours) only
    for programs without their own `hint()`.
    """
    c = self.config
    writer = c.designer.get("hint_source", "writer") == "writer"
    need = [
        i
        for i, v in enumerate(verdicts)
        if v.valid and (writer or not v.has_hint)
    ]
    if not need:
      return verdicts
    _log("iteration %d: writing %d hints", it + 1, len(need))
    # A hint may take up to half the context (the reference's 4096 tokens
    # need a long one); its prompt, the program's code, gets the rest.
    max_new = min(c.designer.hint_max_new_tokens, c.model.max_len // 2)
    budget = c.model.max_len - max_new
    t = time.perf_counter()
    outs = self.engine.sample(
        [
            _fit(
                self.engine.render(designer_prompts.hint_messages(codes[i])),
                budget,
                self.engine.tokenizer.bos_id,
            )
            for i in need
        ],
        role="designer",
        max_new_tokens=max_new,
        temperature=c.designer.hint_temperature,
        seed=_seed_for(c.seed, it, "hint"),
        progress=f"iteration {it + 1}: hint writer",
    )
    timer["sampling"] += time.perf_counter() - t
    out = list(verdicts)
    for i, (_, _, text) in zip(need, outs):
      out[i] = out[i].with_hint(extract.clean_hint(text))
    return out

  def _designer_prompt(self, doc, examples, parent, spec) -> list[int]:
    """Renders a designer prompt within the designer's prompt budget.

    The budget is min(`designer.max_prompt_tokens`, `model.max_len -
    designer.max_new_tokens`). The rule: drop memory examples (the last,
    i.e. least important, first), then halve the grounding document until it
    fits; only a budget that cannot hold the instructions themselves cuts
    them (from the left, keeping BOS), with a warning.
    """
    c = self.config
    budget = rollout_prompts.prompt_budget(
        c.designer.max_prompt_tokens,
        c.model.max_len,
        c.designer.max_new_tokens,
    )
    examples = list(examples)
    while True:
      ids = self.engine.render(
          designer_prompts.designer_messages(
              doc,
              examples,
              parent,
              family=spec.family,
              skill=spec.skill,
              difficulty=spec.difficulty,
              seed=spec.seed,
              max_turns=self.config.agent.max_turns,
              program_hint=self.config.designer.hint_source == "program",
          )
      )
      if len(ids) <= budget:
        return ids
      if examples:
        examples.pop()
      elif doc is not None and len(doc.text) > 200:
        doc = dataclasses.replace(doc, text=doc.text[: len(doc.text) // 2])
      else:
        # Last resort (tiny models): the instructions are cut from the left,
        # keeping BOS. The cut happens once, here, so the sampler and the
        # trainer both see exactly these ids.
        if not self._warned_prompt_cut:
          logging.warning(
              "the designer's instructions take %d tokens, over its prompt"
              " budget of %d (designer.max_prompt_tokens, model.max_len -"
              " designer.max_new_tokens): cutting them from the left",
              len(ids),
              budget,
          )
          self._warned_prompt_cut = True
        return _fit(ids, budget, self.engine.tokenizer.bos_id)

  def pool_programs(self) -> list[records.Environment]:
    """The fixed pool: `train.pool_dir`'s programs, or the seed library
    (those named in `train.pool_seeds`, when given).

    A folder's programs are validated once, in the sandbox; invalid ones are
    left out with their reasons logged, and a folder with no valid program
    is an error.
    """
    if self._pool_programs is not None:
      return self._pool_programs
    c = self.config
    if not c.train.pool_dir:
      names = tuple(c.train.pool_seeds)
      known = {p.name for p in self.seeds}
      unknown = [n for n in names if n not in known]
      if unknown:
        raise ValueError(
            f"config.train.pool_seeds names no training seed {unknown}; one"
            f" of {sorted(known)}"
        )
      self._pool_programs = [
          records.Environment(
              source=p.source, origin="seed", hint=None, name=p.name
          )
          for p in self.seeds
          if not names or p.name in names
      ]
      return self._pool_programs
    folder = os.path.expanduser(c.train.pool_dir)
    if not os.path.isdir(folder):
      raise FileNotFoundError(
          f"config.train.pool_dir={c.train.pool_dir!r} is not a folder; give a"
          " folder of environment programs (*.py)"
      )
    paths = sorted(glob.glob(os.path.join(folder, "*.py")))
    sources = []
    for path in paths:
      with open(path) as f:
        sources.append(f.read())
    verdicts = [
        records.Verdict.from_dict(v) for v in self.envs.validate(sources)
    ]
    pool = []
    for path, source, verdict in zip(paths, sources, verdicts):
      name = os.path.basename(path)
      if verdict.valid:
        pool.append(records.Environment(source, "pool", None, name=name))
      else:
        logging.warning(
            "pool program %s is invalid and left out: %s: %s",
            path,
            verdict.reason,
            verdict.message[:300],
        )
    if not pool:
      raise ValueError(
          f"none of the {len(paths)} programs in {folder} is a valid"
          " environment; check them with `python -m"
          " spade.environments.check --json FILE...`"
      )
    _log(
        "fixed pool: %d of %d programs in %s valid",
        len(pool),
        len(paths),
        folder,
    )
    self._pool_programs = pool
    return pool

  def environments(
      self, it: int, designs: list[records.Design]
  ) -> list[records.Environment]:
    """The environments the agent plays this iteration."""
    c = self.config
    out = [
        records.Environment(
            source=d.code,
            origin="design",
            hint=d.hint,
            design_index=d.index,
            archive_id=d.archive_id,
        )
        for d in designs
        if d.valid
    ]
    num_replay = int(round(c.memory.replay_fraction * c.designer.num_envs))
    for entry in self.state.replay(num_replay, it):
      verdict = records.Verdict.from_dict(entry.verdict)
      out.append(
          records.Environment(
              source=entry.code,
              origin="replay",
              hint=verdict.written_hint,
              archive_id=entry.id,
          )
      )
    fill = c.designer.num_envs - len(out)
    if c.train.mode == "fixed_pool" or (
        c.designer.use_seed_programs and fill > 0
    ):
      pool = self.pool_programs()
      rng = np.random.default_rng(_seed_for(c.seed, it, "seeds"))
      count = c.designer.num_envs if c.train.mode == "fixed_pool" else fill
      if pool:
        picks = rng.choice(len(pool), size=count, replace=len(pool) < count)
        out.extend(pool[int(j)] for j in picks)
    return out

  def play(
      self, it: int, envs: list[records.Environment], hinted_arm: bool = True
  ):
    """`agent.episodes_per_env` episodes without the hint per environment
    and, when `hinted_arm`, `agent.hint_episodes_per_env` with it (0: as
    many); episode k of either arm resets with the same seed."""
    c = self.config
    arms = [(False, c.agent.episodes_per_env)]
    if hinted_arm:
      arms.append((True, self._hint_episodes()))
    specs = []
    for e, env in enumerate(envs):
      for s in range(max(k for _, k in arms)):
        seed = _seed_for(c.seed, it, e, s)
        for hinted, k in arms:
          if s >= k:
            continue
          hint = None
          if hinted:
            hint = env.hint if env.hint is not None else rollout.ENV_HINT
          specs.append(rollout.EpisodeSpec(e, env.source, seed, hint, s))
    _log(
        "iteration %d: agent playing %d episodes on %d environments",
        it + 1,
        len(specs),
        len(envs),
    )
    rows_per_call = c.agent.rows_per_call
    return rollout.run_episodes(
        specs,
        self.engine.agent_sampler(
            max_new_tokens=c.agent.max_new_tokens,
            temperature=c.agent.temperature,
            groups=rollout.num_groups(len(specs), rows_per_call, True),
            progress=f"iteration {it + 1}: agent sampling",
        ),
        self.envs.episodes(),
        self.engine.render,
        max_turns=c.agent.max_turns,
        max_context=self.engine.prompt_budget("agent"),
        seed=_seed_for(c.seed, it, "agent"),
        overlap=True,
        rows_per_call=rows_per_call,
        prompt_style=c.agent.prompt_style,
        progress=lambda line: _log("iteration %d: %s", it + 1, line),
        extend=self.engine.extend if c.agent.episode_rows else None,
        stop_ids=tuple(self.engine.tokenizer.stop_ids),
    )

  def _hint_episodes(self) -> int:
    c = self.config
    return c.agent.hint_episodes_per_env or c.agent.episodes_per_env

  def returns(
      self, envs: list[records.Environment], episodes: list[records.Episode]
  ) -> tuple[np.ndarray, np.ndarray]:
    """R[env, k, hinted] and its mask from played episodes."""
    c = self.config
    k = max(c.agent.episodes_per_env, self._hint_episodes())
    returns = np.zeros((max(len(envs), 1), k, 2), np.float32)
    mask = np.zeros_like(returns, bool)
    for ep in episodes:
      h = int(ep.hinted)
      returns[ep.env_index, ep.sample, h] = ep.episode_return(
          c.agent.return_rule
      )
      # An episode whose environment failed says nothing about the agent or
      # the program's difficulty: it leaves its group.
      mask[ep.env_index, ep.sample, h] = not ep.env_failed
    return returns, mask

  def score(
      self,
      designs: list[records.Design],
      envs: list[records.Environment],
      episodes: list[records.Episode] | None = None,
      arrays: tuple[np.ndarray, np.ndarray] | None = None,
  ) -> records.Scores:
    """Every score of returns R[env, k, hinted] (one jitted call): from
    `episodes`, or from given (returns, mask) arrays (a window's plays)."""
    c = self.config
    returns, mask = (
        arrays if arrays is not None else self.returns(envs, episodes)
    )
    valid_env = np.ones((returns.shape[0],), bool) & (len(envs) > 0)
    design_of_env = np.full((returns.shape[0],), -1, np.int32)
    for e, env in enumerate(envs):
      if env.design_index is not None:
        design_of_env[e] = env.design_index
    out = jax.device_get(
        regret_scoring.make_scorer(c)(
            returns,
            mask,
            valid_env,
            design_of_env,
            np.array([d.valid for d in designs], bool),
            np.array([d.group for d in designs], np.int32),
        )
    )
    summary = {
        k: float(out[k])
        for k in ("return_hint", "return_nohint", "regret_mean", "num_episodes")
    }
    return records.Scores(
        returns=returns,
        mask=mask,
        regret=np.asarray(out["regret"]),
        env_score=np.asarray(out["env_score"]),
        design_reward=np.asarray(out["design_reward"]),
        designer_advantages=np.asarray(out["designer_advantages"]),
        agent_advantages=np.asarray(out["agent_advantages"]),
        summary=summary,
    )

  def rows(
      self,
      designs: list[records.Design],
      episodes: list[records.Episode],
      scores: records.Scores,
  ) -> tuple[list[batching.Row], list[batching.Row], int]:
    """Update rows with signal: (agent rows, designer rows, rows in all).

    A row whose advantage is 0 (its group's returns were all equal) adds
    nothing to the gradient, so it is not batched; episodes of a failed
    environment and, unless `agent.train_on_hinted`, hinted episodes are
    not trained on.
    """
    c = self.config
    agent_rows, total = [], 0
    for ep in episodes:
      if ep.env_failed or (ep.hinted and not c.agent.train_on_hinted):
        continue
      a = float(
          scores.agent_advantages[ep.env_index, ep.sample, int(ep.hinted)]
      )
      if ep.exact and any(t.completion_ids for t in ep.turns):
        # The whole episode as one row: replies unmasked, the environment's
        # words between them masked, scored once.
        total += 1
        if a != 0.0:
          agent_rows.append(
              batching.Row(
                  ep.tokens[: ep.prompt_len],
                  ep.tokens[ep.prompt_len :],
                  ep.token_logprobs[ep.prompt_len :],
                  a,
                  mask=ep.token_mask[ep.prompt_len :],
              )
          )
        continue
      for turn in ep.turns:
        if not turn.completion_ids:
          continue
        total += 1
        if a != 0.0:
          agent_rows.append(
              batching.Row(
                  turn.prompt(ep), turn.completion_ids, turn.logprobs, a
              )
          )
    designer_rows = []
    for d, a in zip(designs, scores.designer_advantages):
      total += 1
      if float(a) != 0.0:
        designer_rows.append(
            batching.Row(d.prompt_ids, d.completion_ids, d.logprobs, float(a))
        )
    return agent_rows, designer_rows, total

  # -- one iteration ----------------------------------------------------------

  def iteration(self, it: int) -> dict[str, float]:
    """Runs iteration `it` and returns its metrics.

    In "spade" mode the designer regenerates the pool every
    `designer.regeneration_interval` iterations (the reference's 4) and the
    agent plays it with and without hints then; in between it plays the
    same pool without hints. When the window ends, the designer's rewards
    are computed from every play of the window, and its rows go to the
    update (after `optim.designer_delay` more iterations).
    """
    c = self.config
    timer = {"sampling": 0.0, "sandbox": 0.0, "update": 0.0}
    t_start = time.perf_counter()
    prefill = self.engine.prefill_counts()
    designs, extra = ([], {})
    window = self.state.window
    regenerate = c.train.mode == "spade" and window is None
    if regenerate:
      designs, extra = self.design(it, timer)
    if window is None:
      envs = self.environments(it, designs)
      window = records.Window(
          start=it,
          envs=envs,
          designs=designs,
          plays=[[[], []] for _ in envs],
      )
    envs = window.envs
    hinted_arm = window.start == it
    episodes, stats = self.play(it, envs, hinted_arm=hinted_arm)
    timer["sampling"] += stats.sampling_s
    timer["sandbox"] += stats.sandbox_s
    scores = self.score([], envs, episodes)
    agent_rows, _, total = self.rows([], episodes, scores)
    window.add(scores.returns, scores.mask)
    interval = (
        c.designer.regeneration_interval if c.train.mode == "spade" else 1
    )
    closes = it + 1 - window.start >= max(1, interval)
    # Regret, designer rewards and memory stats: over the window's plays.
    window_scores = self.score(window.designs, envs, arrays=window.arrays())
    designer_rows = []
    if closes:
      _, designer_rows, designer_total = self.rows(
          window.designs, [], window_scores
      )
      total += designer_total
      self._remember(it, envs, window_scores)
      self.state.window = None
    else:
      self.state.window = window
    due = self.state.delay_designer_rows(
        it, designer_rows, c.optim.designer_delay
    )
    signal = len(agent_rows) + len(designer_rows)
    t = time.perf_counter()
    if agent_rows or due:
      _log(
          "iteration %d: update on %d agent and %d designer rows (%d of %d"
          " rows this iteration carry signal)",
          it + 1,
          len(agent_rows),
          len(due),
          signal,
          total,
      )
      update_metrics = self.engine.update(agent_rows, due)
    else:
      _log(
          "iteration %d: no row carries signal (every group's returns were"
          " equal); update skipped",
          it + 1,
      )
      update_metrics = {"train/update_skipped": 1.0}
    timer["update"] += time.perf_counter() - t
    update_metrics.setdefault("train/update_skipped", 0.0)
    update_metrics["update/agent_rows"] = float(len(agent_rows))
    update_metrics["update/designer_rows"] = float(len(due))
    self._save_programs(it, designs, envs, scores, window_scores, episodes)
    self.designed = designs

    reasons: dict[str, int] = {}
    for d in designs:
      if not d.valid:
        reasons[d.verdict.reason] = reasons.get(d.verdict.reason, 0) + 1
    lengths = [len(ep.turns) for ep in episodes] or [0]
    summary = window_scores.summary
    out = {
        "designer/num_designs": float(len(designs)),
        "designer/valid_rate": (
            float(np.mean([d.valid for d in designs])) if designs else 0.0
        ),
        "designer/reward_mean": (
            float(window_scores.design_reward.mean()) if window.designs else 0.0
        ),
        "designer/window_closed": float(closes),
        "designer/diversity": self.state.diversity([d.code for d in designs]),
        "regret/mean": summary["regret_mean"],
        "agent/return_hint": summary["return_hint"],
        "agent/return_nohint": scores.summary["return_nohint"],
        "agent/window_return_nohint": summary["return_nohint"],
        "agent/hint_gap": summary["return_hint"] - summary["return_nohint"],
        "agent/hinted_arm": float(hinted_arm),
        "agent/episodes": float(len(episodes)),
        "agent/episode_length_mean": float(np.mean(lengths)),
        "agent/episode_length_max": float(np.max(lengths)),
        "agent/episode_errors": float(
            sum(ep.error is not None for ep in episodes)
        ),
        "agent/env_failed_episodes": float(
            sum(ep.env_failed for ep in episodes)
        ),
        "agent/tool_calls": float(stats.tool_calls),
        "agent/num_envs": float(len(envs)),
        "agent/seed_envs": float(
            sum(e.origin in ("seed", "pool") for e in envs)
        ),
        "train/rows_with_signal": float(signal),
        "train/rows_total": float(total),
        "tokens/sampled": float(
            stats.tokens_sampled + sum(len(d.completion_ids) for d in designs)
        ),
        # Prompt tokens the sampler would prefill row by row, the share its
        # prefix and identical-prompt sharing and carried caches saved, and
        # the history tokens carried from an episode's last turn.
        "tokens/prefill": float(self.engine.prefill_counts()[0] - prefill[0]),
        "tokens/prefill_saved": float(
            self.engine.prefill_counts()[1] - prefill[1]
        ),
        "tokens/carried": float(self.engine.prefill_counts()[2] - prefill[2]),
        "time/sampling_s": timer["sampling"],
        "time/sandbox_s": timer["sandbox"],
        "time/rollout_sandbox_s": stats.sandbox_s,
        "time/sandbox_hidden_s": stats.sandbox_hidden_s,
        "time/update_s": timer["update"],
        "time/iteration_s": time.perf_counter() - t_start,
    }
    out.update({f"designer/invalid/{r}": float(n) for r, n in reasons.items()})
    out.update(extra)
    out.update(update_metrics)
    out.update(
        self.state.metrics(
            replayed=sum(e.origin == "replay" for e in envs), total=len(envs)
        )
    )
    return out

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
        disable=jax.process_index() != 0,
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
        self.designed, self.config.memory.duplicate_threshold
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


def _fit(ids: list[int], budget: int, bos: int) -> list[int]:
  """ids cut from the left to `budget`, keeping a leading BOS."""
  if len(ids) <= budget:
    return ids
  if ids and ids[0] == bos:
    return [bos] + ids[len(ids) - budget + 1 :]
  return ids[-budget:]


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
