"""The SPADE host loop: design, validate, play, score, update, remember, save.

One iteration (see DESIGN.md):

  1. designer  grounding documents + memory examples -> prompts -> sampled
               programs (designer head) -> validated in the sandbox -> kept in
               the archive (near-duplicates rejected) -> hints (the program's
               `hint()`, else one the model writes from the code at
               `designer.hint_temperature`).
  2. agent     K episodes without and K with the hint for every playable
               environment (new valid designs, replayed archive entries, and,
               when `designer.use_seed_programs` is set and too few designs
               are valid, seed-library programs), all advancing together.
  3. regret    returns R[env, k, hinted] -> designer rewards and advantages in
               jitted reductions (spade.regret).
  4. update    one jitted, sharded, donated step on the shared parameters
               (spade.train.update).
  5. memory, metrics (metrics.jsonl + TensorBoard), programs and verdicts
     under WORKDIR/programs/iter_NNNNNN/, and an orbax checkpoint of the whole
     state every `train.checkpoint_every` iterations.

`train.mode="fixed_pool"` is the baseline: no designer; the agent plays the
seed library alone with the same compute.

Starting again on the same workdir resumes from the newest checkpoint.
"""

from __future__ import annotations

import dataclasses
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

from spade.agent import rollout
from spade.designer import extract
from spade.designer import prompts as designer_prompts
from spade.environments import library
from spade.eval import runner as eval_runner
from spade.regret import advantages as adv_lib
from spade.regret import estimators
from spade.selfplay import batching
from spade.train import checkpoints
from spade.selfplay import curriculum as curriculum_lib
from spade.selfplay import engine as engine_lib
from spade.selfplay import metrics as metrics_lib
from spade.selfplay import multihost

PROGRAMS_DIR = "programs"


@dataclasses.dataclass
class Playable:
  """An environment the agent plays this iteration."""

  source: str
  origin: str  # "design" | "replay" | "seed"
  hint: str | None  # a written hint; None: ask the environment's hint()
  design_index: int | None = None  # index into this iteration's designs
  archive_id: str | None = None
  name: str = ""


def _log(fmt: str, *args) -> None:
  """A progress line on process 0 (the phases can take minutes on a CPU)."""
  if jax.process_index() == 0:
    logging.info(fmt, *args)


def _seed_for(*parts: Any) -> int:
  """A stable 31-bit seed from any parts (same on every process and run)."""
  digest = hashlib.sha256(repr(parts).encode()).digest()
  return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


class Trainer:
  """Holds the run's services and state; `run()` iterates to the end."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str):
    self.config = config
    self.workdir = workdir
    os.makedirs(workdir, exist_ok=True)
    if jax.process_index() == 0:
      with open(os.path.join(workdir, "config.json"), "w") as f:
        f.write(config.to_json_best_effort(indent=2))
    self.engine = engine_lib.Engine(config)
    self.manager = checkpoints.make_manager(
        workdir, keep=config.train.keep_checkpoints
    )
    self.writer = metrics_lib.MetricWriter(workdir)
    self.curriculum = curriculum_lib.Curriculum(config)
    self.start = 0
    restored = checkpoints.restore_latest(
        self.manager, checkpoints.abstract_like(self.engine.state)
    )
    if restored is not None:
      step, state, curriculum = restored
      self.engine.state = state
      self.curriculum.load(curriculum)
      self.start = step
      self.writer.drop_after(step)
      logging.info("resumed from %s at iteration %d", workdir, step)
    self.seeds = [
        p for p in library.seed_programs() if not getattr(p, "heldout", False)
    ]

  # -- phases ---------------------------------------------------------------

  def design(self, it: int, timer: dict) -> tuple[list[dict], dict]:
    """Samples, extracts, validates and archives this iteration's programs."""
    c = self.config
    group = max(1, c.designer.samples_per_prompt)
    num_prompts = max(1, c.designer.num_envs // group)
    docs = self.curriculum.documents(num_prompts)
    prompts, groups, doc_ids, parents = [], [], [], []
    mutate = np.random.default_rng(_seed_for(c.seed, it, "mutate"))
    for g, doc in enumerate(docs):
      examples = self.curriculum.examples(doc, c.memory.num_examples)
      parent = None
      if mutate.random() < c.memory.mutation_fraction:
        parent = self.curriculum.mutation_parent(_seed_for(c.seed, it, g))
      ids = self._designer_prompt(doc, examples, parent)
      for _ in range(group):
        prompts.append(ids)
        groups.append(g)
        doc_ids.append(getattr(doc, "id", None))
        parents.append(getattr(parent, "id", None))
    _log(
        "iteration %d: designer sampling %d programs (up to %d tokens)",
        it + 1,
        len(prompts),
        c.designer.max_new_tokens,
    )
    t = time.perf_counter()
    samples = self.engine.sample(
        prompts,
        role="designer",
        max_new_tokens=c.designer.max_new_tokens,
        temperature=c.designer.temperature,
        seed=_seed_for(c.seed, it, "designer"),
    )
    seconds = time.perf_counter() - t
    timer["sampling"] += seconds
    tokens = sum(len(ids) for ids, _, _ in samples)
    _log(
        "iteration %d: sampled %d designer tokens in %.1fs (%.1f tok/s);"
        " validating in the sandbox",
        it + 1,
        tokens,
        seconds,
        tokens / max(seconds, 1e-9),
    )
    codes = [extract.extract_code(text) for _, _, text in samples]
    t = time.perf_counter()
    verdicts = self.engine.validate(codes)
    timer["sandbox"] += time.perf_counter() - t
    _log(
        "iteration %d: %d/%d programs valid (%.1fs); reasons: %s",
        it + 1,
        sum(bool(v.get("valid")) for v in verdicts),
        len(verdicts),
        time.perf_counter() - t,
        ", ".join(sorted({str(v.get("reason")) for v in verdicts})),
    )
    designs = []
    duplicates = 0
    for i, (code, verdict) in enumerate(zip(codes, verdicts)):
      entry_id, dup_of = self.curriculum.archive_add(
          code, verdict, it, doc_ids[i], parent=parents[i]
      )
      if dup_of is not None:
        duplicates += 1
        verdict = dict(
            verdict,
            valid=False,
            reason="duplicate",
            message=f"near-duplicate of {dup_of}",
        )
      designs.append(
          {
              "code": code,
              "verdict": verdict,
              "group": groups[i],
              "prompt_ids": prompts[i],
              "completion_ids": samples[i][0],
              "logprobs": samples[i][1],
              "archive_id": entry_id,
              "grounding_id": doc_ids[i],
          }
      )
    # Hints the model writes for valid programs without their own hint().
    need = [
        d
        for d in designs
        if d["verdict"].get("valid") and not d["verdict"].get("has_hint")
    ]
    if need:
      _log("iteration %d: writing %d hints", it + 1, len(need))
      t = time.perf_counter()
      outs = self.engine.sample(
          [
              self.engine.render(designer_prompts.hint_messages(d["code"]))
              for d in need
          ],
          role="designer",
          max_new_tokens=c.designer.hint_max_new_tokens,
          temperature=c.designer.hint_temperature,
          seed=_seed_for(c.seed, it, "hint"),
      )
      timer["sampling"] += time.perf_counter() - t
      for d, (_, _, text) in zip(need, outs):
        d["hint"] = extract.clean_hint(text)
        # Kept with the archived program so a replay can reuse it.
        d["verdict"]["written_hint"] = d["hint"]
    return designs, {
        "memory/duplicates_this_iter": float(duplicates),
        "designer/mutations": float(sum(p is not None for p in parents)),
    }

  def _designer_prompt(self, doc, examples, parent) -> list[int]:
    """Renders a designer prompt within `designer.max_prompt_tokens`.

    The rule: drop memory examples (the last, i.e. least important, first),
    then halve the grounding document until it fits; the instructions and the
    contract are never cut. A prompt that still does not fit is cut from the
    left as the last resort.
    """
    budget = self.config.designer.max_prompt_tokens
    examples = list(examples)
    while True:
      ids = self.engine.render(
          designer_prompts.designer_messages(doc, examples, parent)
      )
      if len(ids) <= budget:
        return ids
      if examples:
        examples.pop()
      elif doc is not None and len(doc.text) > 200:
        doc = dataclasses.replace(doc, text=doc.text[: len(doc.text) // 2])
      else:
        return ids[-budget:]

  def playables(self, it: int, designs: list[dict]) -> list[Playable]:
    """The environments the agent plays this iteration."""
    c = self.config
    out = [
        Playable(
            source=d["code"],
            origin="design",
            hint=d.get("hint"),
            design_index=i,
            archive_id=d["archive_id"],
        )
        for i, d in enumerate(designs)
        if d["verdict"].get("valid")
    ]
    num_replay = int(round(c.memory.replay_fraction * c.designer.num_envs))
    for entry in self.curriculum.replay(num_replay, it):
      out.append(
          Playable(
              source=entry.code,
              origin="replay",
              hint=(
                  None
                  if entry.verdict.get("has_hint")
                  else entry.verdict.get("written_hint")
              ),
              archive_id=entry.id,
          )
      )
    fill = c.designer.num_envs - len(out)
    if c.train.mode == "fixed_pool" or (
        c.designer.use_seed_programs and fill > 0
    ):
      rng = np.random.default_rng(_seed_for(c.seed, it, "seeds"))
      count = c.designer.num_envs if c.train.mode == "fixed_pool" else fill
      for j in rng.choice(len(self.seeds), size=count, replace=False):
        seed = self.seeds[int(j)]
        out.append(
            Playable(
                source=seed.source, origin="seed", hint=None, name=seed.name
            )
        )
    return out

  def play(self, it: int, envs: list[Playable]):
    """K episodes with and K without the hint per environment."""
    c = self.config
    k = c.agent.episodes_per_env
    specs = []
    for e, env in enumerate(envs):
      for s in range(k):
        seed = _seed_for(c.seed, it, e, s)
        for hinted in (False, True):
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
    episodes, stats = rollout.run_episodes(
        specs,
        self.engine.agent_sampler(
            max_new_tokens=c.agent.max_new_tokens,
            temperature=c.agent.temperature,
        ),
        self.engine.executor(),
        self.engine.render,
        max_turns=c.agent.max_turns,
        max_context=c.agent.max_context,
        seed=_seed_for(c.seed, it, "agent"),
        overlap=True,
        progress=lambda line: _log("iteration %d: %s", it + 1, line),
    )
    returns = np.zeros((max(len(envs), 1), k, 2), np.float32)
    mask = np.zeros_like(returns, bool)
    for ep in episodes:
      h = int(ep.spec.hinted)
      returns[ep.spec.env_index, ep.spec.sample, h] = ep.episode_return
      mask[ep.spec.env_index, ep.spec.sample, h] = ep.error is None or bool(
          ep.turns
      )
    return episodes, stats, returns, mask

  # -- one iteration ----------------------------------------------------------

  def iteration(self, it: int) -> dict[str, float]:
    """Runs iteration `it` and returns its metrics."""
    c = self.config
    timer = {"sampling": 0.0, "sandbox": 0.0, "update": 0.0}
    t_start = time.perf_counter()
    designs, extra = ([], {})
    if c.train.mode == "spade":
      designs, extra = self.design(it, timer)
    envs = self.playables(it, designs)
    episodes, stats, returns, mask = self.play(it, envs)
    timer["sampling"] += stats.sampling_s
    timer["sandbox"] += stats.sandbox_s
    valid_env = np.ones((returns.shape[0],), bool) & (len(envs) > 0)

    # Designer rewards: every design gets one, invalid ones the penalty.
    reward_fn = estimators.designer_reward(c.regret.estimator, c.regret)
    env_scores = np.asarray(reward_fn(returns, mask, valid_env))
    design_reward = np.full((len(designs),), c.regret.invalid_penalty, float)
    for e, env in enumerate(envs):
      if env.design_index is not None:
        design_reward[env.design_index] = env_scores[e]
    summary = {
        k: float(v)
        for k, v in estimators.summarize(returns, mask, valid_env).items()
    }
    hint_regret = np.asarray(estimators.hint_regret(returns, mask))

    # Advantages and the update batch.
    agent_adv = np.asarray(
        adv_lib.agent_advantages(
            returns,
            mask,
            eps=c.regret.advantage_eps,
            separate_arms=c.regret.separate_arms,
        )
    )
    agent_rows = []
    for ep in episodes:
      a = float(
          agent_adv[ep.spec.env_index, ep.spec.sample, int(ep.spec.hinted)]
      )
      for turn in ep.turns:
        if turn.completion_ids:
          agent_rows.append(
              batching.Row(
                  turn.prompt_ids, turn.completion_ids, turn.logprobs, a
              )
          )
    designer_rows = []
    if designs:
      d_adv = np.asarray(
          adv_lib.group_advantages(
              design_reward.astype(np.float32),
              np.array([d["group"] for d in designs], np.int32),
              np.ones((len(designs),), bool),
              eps=c.regret.advantage_eps,
          )
      )
      designer_rows = [
          batching.Row(
              d["prompt_ids"], d["completion_ids"], d["logprobs"], float(a)
          )
          for d, a in zip(designs, d_adv)
      ]
    _log(
        "iteration %d: update on %d agent and %d designer rows",
        it + 1,
        len(agent_rows),
        len(designer_rows),
    )
    t = time.perf_counter()
    update_metrics = self.engine.update(agent_rows, designer_rows, it)
    timer["update"] += time.perf_counter() - t

    # Memory: stats of everything played.
    for e, env in enumerate(envs):
      if env.archive_id is None:
        continue
      m = mask[e]
      win = (
          lambda h: float(returns[e, :, h][m[:, h]].mean())
          if m[:, h].any()
          else 0.0
      )
      self.curriculum.update_stats(
          env.archive_id,
          iteration=it,
          regret=float(hint_regret[e]),
          win_rate_hint=win(1),
          win_rate_nohint=win(0),
          episodes=int(m.sum()),
      )
    self._save_programs(it, designs, envs, returns, mask)

    reasons: dict[str, int] = {}
    for d in designs:
      r = d["verdict"].get("reason", "unknown")
      if not d["verdict"].get("valid"):
        reasons[r] = reasons.get(r, 0) + 1
    lengths = [len(ep.turns) for ep in episodes] or [0]
    out = {
        "designer/num_designs": float(len(designs)),
        "designer/valid_rate": (
            float(np.mean([bool(d["verdict"].get("valid")) for d in designs]))
            if designs
            else 0.0
        ),
        "designer/reward_mean": float(design_reward.mean()) if designs else 0.0,
        "designer/diversity": self.curriculum.diversity(
            [d["code"] for d in designs]
        ),
        "regret/mean": summary["regret_mean"],
        "agent/return_hint": summary["return_hint"],
        "agent/return_nohint": summary["return_nohint"],
        "agent/hint_gap": summary["return_hint"] - summary["return_nohint"],
        "agent/episodes": float(len(episodes)),
        "agent/episode_length_mean": float(np.mean(lengths)),
        "agent/episode_length_max": float(np.max(lengths)),
        "agent/episode_errors": float(
            sum(ep.error is not None for ep in episodes)
        ),
        "agent/num_envs": float(len(envs)),
        "agent/seed_envs": float(sum(e.origin == "seed" for e in envs)),
        "tokens/sampled": float(
            stats.tokens_sampled
            + sum(len(d["completion_ids"]) for d in designs)
        ),
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
        self.curriculum.metrics(
            replayed=sum(e.origin == "replay" for e in envs), total=len(envs)
        )
    )
    return out

  def _save_programs(self, it, designs, envs, returns, mask):
    if not self.config.train.save_programs or jax.process_index() != 0:
      return
    folder = os.path.join(self.workdir, PROGRAMS_DIR, f"iter_{it:06d}")
    os.makedirs(folder, exist_ok=True)
    index = []
    for i, d in enumerate(designs):
      name = f"design_{i:03d}.py"
      with open(os.path.join(folder, name), "w") as f:
        f.write(d["code"])
      index.append(
          {
              "file": name,
              "verdict": d["verdict"],
              "hint": d.get("hint"),
              "archive_id": d["archive_id"],
              "grounding_id": d["grounding_id"],
          }
      )
    played = []
    for e, env in enumerate(envs):
      m = mask[e]
      played.append(
          {
              "origin": env.origin,
              "design_index": env.design_index,
              "archive_id": env.archive_id,
              "name": env.name,
              "return_nohint": (
                  float(returns[e, :, 0][m[:, 0]].mean())
                  if m[:, 0].any()
                  else None
              ),
              "return_hint": (
                  float(returns[e, :, 1][m[:, 1]].mean())
                  if m[:, 1].any()
                  else None
              ),
          }
      )
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
                self.engine.pool,
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
      logging.info(
          "iteration %d: sampling %.1fs sandbox %.1fs (%.1fs hidden) update"
          " %.1fs; valid %.2f regret %.3f return %.2f/%.2f",
          step,
          m["time/sampling_s"],
          m["time/sandbox_s"],
          m["time/sandbox_hidden_s"],
          m["time/update_s"],
          m["designer/valid_rate"],
          m["regret/mean"],
          m["agent/return_nohint"],
          m["agent/return_hint"],
      )
      if step % c.train.checkpoint_every == 0 or step == c.num_iterations:
        checkpoints.save(
            self.manager, step, self.engine.state, self.curriculum.state()
        )
        self.curriculum.write_memory_file(self.workdir)
    self.writer.close()
    self.engine.close()


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Runs (or resumes) SPADE with `config` in `workdir`."""
  Trainer(config, workdir).run()
