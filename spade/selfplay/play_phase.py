"""The play phase: the iteration's environments and the agent's episodes.

`environments` picks what the agent plays (new valid designs, archive
replays, the fixed pool or seed programs, or in adaptive mode a levelled
family at each environment's level, `spade.selfplay.adaptive`), and
`top_up_environments` what tops up an open window; `play` runs
K episodes without and, at regeneration, K with the hint per environment,
each an independent request to the slot engine (`spade.agent.rollout`);
episode k of either arm resets with the same seed. An unhinted play whose
environment failed (not by hanging) is played again
(`agent.retry_failed_plays`); a program whose play hung is left out for the
rest of the run (`environments.blacklist_hung`, `LoopState.hung`).
`environments` returns what it drew (`Drawn`); `play` returns the episodes;
neither assigns to the loop state.
"""

from __future__ import annotations

import dataclasses
import glob
import os
from typing import Any, Collection

from absl import logging
import ml_collections
import numpy as np

from spade import console
from spade.agent import rollout
from spade.environments import library
from spade.selfplay import adaptive
from spade.selfplay import records
from spade.selfplay import score as score_lib
from spade.selfplay.seeding import seed_for
from spade.train import modes


def pool_programs(
    config: ml_collections.ConfigDict, executor, seeds
) -> list[records.Environment]:
  """The fixed pool: `train.pool_dir`'s programs, or the seed library
  (those named in `train.pool_seeds`, when given).

  A folder's programs are validated in the sandbox; invalid ones are left
  out with their reasons logged, and a folder with no valid program is an
  error.
  """
  c = config
  if not c.train.pool_dir:
    names = tuple(c.train.pool_seeds)
    known = {p.name for p in seeds}
    unknown = [n for n in names if n not in known]
    if unknown:
      raise ValueError(
          f"config.train.pool_seeds names no training seed {unknown}; one"
          f" of {sorted(known)}"
      )
    return [
        records.Environment(
            source=p.source, origin="seed", hint=None, name=p.name
        )
        for p in seeds
        if not names or p.name in names
    ]
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
  pool = []
  for path, source, verdict in zip(paths, sources, executor.validate(sources)):
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
  console.say(
      "fixed pool: %d of %d programs in %s valid", len(pool), len(paths), folder
  )
  return pool


@dataclasses.dataclass(frozen=True)
class Drawn:
  """What the play phase drew for a new pool: the environments, the
  (name, level) each is played at (adaptive mode), the static pool's draw
  cursor after the draw and the fixed pool (validated once per run)."""

  envs: list[records.Environment]
  levels: list[tuple[str, int]]
  pool_cursor: Any
  pool: tuple[records.Environment, ...] | None


def environments(
    config: ml_collections.ConfigDict,
    state,
    it: int,
    designs: list[records.Design],
    executor,
) -> Drawn:
  """The environments the agent plays in iteration `it` and what drawing
  them changed; the fixed pool (`state.pool`, else `pool_programs` of the
  seed library, validated by `executor`) is read only when needed."""
  c = config
  mode = modes.get(c)
  if mode.levelled:
    envs, levels = adaptive.environments(c, state, it)
    return Drawn(envs, levels, state.pool_cursor, state.pool)
  pool = state.pool

  def programs():
    nonlocal pool
    if pool is None:
      pool = tuple(pool_programs(c, executor, library.train_programs()))
    return pool

  out, cursor = _new_environments(config, state, it, designs, programs)
  # The reference's Stage 3 (`collect_trajectories`): a program whose play
  # hung is not played again; nothing takes its place.
  envs = [env for env in out if not state.is_hung(env.source)]
  return Drawn(envs, [], cursor, pool)


def _new_environments(config, state, it, designs, pool):
  """`environments` before the hung programs are left out, and the static
  pool's cursor after the draw."""
  c = config
  cursor = state.pool_cursor
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
  for entry in state.replay(num_replay, it):
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
  from_pool = modes.get(c).pool
  if from_pool or (c.designer.use_seed_programs and fill > 0):
    programs = pool()
    rng = np.random.default_rng(seed_for(c.seed, it, "seeds"))
    count = c.designer.num_envs if from_pool else fill
    if programs and (from_pool and c.train.pool_draw == "without_replacement"):
      by_name = {p.name: p for p in programs}
      names, cursor = state.draw_pool([p.name for p in programs], count)
      out.extend(by_name[n] for n in names)
    elif programs:
      picks = rng.choice(
          len(programs), size=count, replace=len(programs) < count
      )
      out.extend(programs[int(j)] for j in picks)
  return out, cursor


def top_up_environments(
    designs: list[records.Design],
) -> list[records.Environment]:
  """The environments that top up an open window (`designer.top_up`): its
  top-up designs' valid programs, in order, without a written hint (no
  hinted arm plays them); `records.Window.with_envs` adds them last."""
  return [
      records.Environment(
          source=d.code, origin="top_up", hint=None, archive_id=d.archive_id
      )
      for d in designs
      if d.valid
  ]


def play(
    config: ml_collections.ConfigDict,
    engine,
    executor,
    it: int,
    envs: list[records.Environment],
    hinted_arm: bool,
    skip: Collection[int] = (),
):
  """Plays `rollout.unhinted_plays` episodes without the hint per
  environment and, when `hinted_arm` (and `agent.play_hinted`, never in
  adaptive mode), `score.hint_episodes` with it; returns (episodes,
  `rollout.RolloutStats`).

  The environments whose indices are in `skip` (programs that hung earlier
  in the run) are not played, and the plays are shared among the others.
  Unhinted plays whose environment failed other than by hanging are played
  again up to `agent.retry_failed_plays` times (`rollout.retry_failed`).
  """
  c = config
  playable = [e for e in range(len(envs)) if e not in skip]
  unhinted = rollout.unhinted_plays(
      len(playable), c.agent.plays_per_iteration, c.agent.episodes_per_env
  )
  arms = [(False, unhinted)]
  if hinted_arm and c.agent.play_hinted and modes.get(c).hinted:
    arms.append((True, score_lib.hint_episodes(c)))
  specs = []
  for e in playable:
    env = envs[e]
    for s in range(max(k for _, k in arms)):
      seed = seed_for(c.seed, it, e, s)
      for hinted, k in arms:
        if s >= k:
          continue
        hint = None
        if hinted:
          hint = env.hint if env.hint is not None else rollout.ENV_HINT
        specs.append(rollout.EpisodeSpec(e, env.source, seed, hint, s))
  console.say(
      "iteration %d: agent playing %d episodes on %d environments",
      it + 1,
      len(specs),
      len(playable),
  )
  if skip:
    console.say(
        "iteration %d: %d environments left out: their play hung earlier",
        it + 1,
        len(envs) - len(playable),
    )

  def run(specs, seed):
    sampler = engine.agent_server(
        max_new_tokens=c.agent.max_new_tokens,
        temperature=c.agent.temperature,
        top_k=c.agent.top_k,
        top_p=c.agent.top_p,
    )
    return rollout.run_episodes(
        specs,
        sampler,
        executor.episodes(),
        engine.render,
        max_turns=c.agent.max_turns,
        max_context=engine.prompt_budget("agent"),
        seed=seed,
        prompt_style=c.agent.prompt_style,
        progress=lambda line: console.say("iteration %d: %s", it + 1, line),
        extend=engine.extend if c.agent.episode_rows else None,
        stop_ids=tuple(engine.tokenizer.stop_ids),
        action_rule=c.agent.action,
        unfinished_reply=c.agent.unfinished_reply,
        hinted_unfinished_reply=c.agent.hinted_unfinished_reply,
        full_context=c.agent.full_context,
        mask_malformed_tool_calls=c.agent.mask_malformed_tool_calls,
    )

  def play_again(again, attempt):
    console.say(
        "iteration %d: playing %d failed plays again", it + 1, len(again)
    )
    # The same environments and seeds, sampled afresh.
    return run(again, seed_for(c.seed, it, "agent", "retry", attempt))

  episodes, stats = run(specs, seed_for(c.seed, it, "agent"))
  return rollout.retry_failed(
      specs, episodes, stats, play_again, c.agent.retry_failed_plays
  )
