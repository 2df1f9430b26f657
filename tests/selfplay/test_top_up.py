"""Pool top-up (`designer.top_up`): an open window short of its pool size
designs the missing environments, as the reference's `collect_trajectories`
does at a rollout that does not regenerate (spade/core/orchestrator.py,
Stage 2). A fake policy and a scripted play phase (no model, no sandbox)
drive the real `loop.iteration`.
"""

import json

import ml_collections
import numpy as np
import pytest

from spade import config as config_lib
from spade.agent import episodes as episodes_lib
from spade.agent import rollout
from spade.selfplay import loop
from spade.selfplay import play_phase
from spade.selfplay import records
from spade.selfplay import score as score_lib
from spade.selfplay import state as state_lib
from tests.selfplay import fakes


def _config(**overrides):
  c = config_lib.base_config()
  c.grounding.enabled = False
  c.memory.enabled = False
  c.designer.num_envs = 4
  c.designer.samples_per_prompt = 1
  c.designer.max_attempts = 1
  c.designer.use_seed_programs = False
  c.designer.regeneration_interval = 5
  c.agent.episodes_per_env = 2
  c.num_iterations = 10  # no flush in these runs
  for key, value in overrides.items():
    section, name = key.split(".")
    c[section][name] = value
  config_lib.validate(c)
  return c


def _episode(env, k, hinted, reward, failure=None):
  turn = episodes_lib.Turn((1, 2), (3, 4), (-0.1, -0.2), "a", reward, "o")
  return episodes_lib.Episode(
      env_index=env,
      sample=k,
      hinted=hinted,
      seed=0,
      hint="h" if hinted else None,
      first_observation="x",
      turns=(turn,),
      terminated=failure is None,
      truncated=False,
      env_failed=failure is not None,
      failure=failure,
  )


class Plays:
  """`play_phase.play`'s stand-in: records what each iteration played; play
  k of every environment wins for k = 0 only; play 1 of the environments
  whose indices are in `hangs` runs past its budget."""

  def __init__(self, hangs=()):
    self.calls = []
    self.hangs = set(hangs)

  def __call__(self, config, engine, executor, it, envs, hinted_arm, skip=()):
    del config, engine, executor, skip
    self.calls.append((it, list(envs), hinted_arm))
    eps = []
    for e in range(len(envs)):
      for k in range(2):
        hung = k == 1 and e in self.hangs
        eps.append(
            _episode(
                e, k, False, float(k == 0), "call_timeout" if hung else None
            )
        )
        if hinted_arm:
          eps.append(_episode(e, k, True, 1.0))
    return eps, rollout.RolloutStats()


def _run(config, engine, iterations):
  state = state_lib.LoopState.create(config)
  metrics = []
  for it in range(iterations):
    state, m = loop.iteration(config, engine, engine, state, it)
    metrics.append(m)
  return state, metrics


def test_a_short_pool_is_topped_up_and_the_new_games_are_played_unhinted(
    monkeypatch,
):
  # 4 designs at regeneration, 2 valid; the next iteration designs the 2
  # missing (1 valid), the one after the 1 still missing; then it is full.
  c = _config()
  assert c.designer.top_up  # the reference's
  engine = fakes.FakeEngine(valid=[True, False, True, False, True, False])
  plays = Plays()
  assert c.designer.regeneration_interval == 5  # one window throughout
  monkeypatch.setattr(play_phase, "play", plays)
  state, m = _run(c, engine, 4)
  assert [x["designer/top_up"] for x in m] == [0.0, 2.0, 1.0, 0.0]
  assert [x["designer/num_designs"] for x in m] == [4.0, 2.0, 1.0, 0.0]
  assert m[1]["designer/valid_rate"] == 0.5
  # The same design phase (4 programs, then hints for the 2 valid ones at
  # regeneration); a top-up samples its programs and writes no hint.
  assert engine.sampled == [
      ("designer", 4),
      ("designer", 2),
      ("designer", 2),
      ("designer", 1),
  ]
  played = [[e.origin for e in envs] for _, envs, _ in plays.calls]
  assert played == [
      ["design"] * 2,
      ["design"] * 2 + ["top_up"],
      ["design"] * 2 + ["top_up"] * 2,
      ["design"] * 2 + ["top_up"] * 2,
  ]
  # Hinted at regeneration only; a top-up has no hint of its own.
  assert [h for _, _, h in plays.calls] == [True, False, False, False]
  window = state.window
  assert all(e.hint is None for e in window.envs[2:])
  assert len(window.designs) == 4  # the regeneration's only
  # Played from the step they joined: earlier steps masked, never hinted.
  plays_per_step = window.mask[..., 0].sum(axis=2)
  np.testing.assert_array_equal(
      plays_per_step, [[2, 2, 2, 2], [2, 2, 2, 2], [0, 2, 2, 2], [0, 0, 2, 2]]
  )
  assert not window.mask[2:, ..., 1].any()
  np.testing.assert_array_equal(window.returns[2, 0], 0.0)
  np.testing.assert_array_equal(window.returns[3, :2], 0.0)
  # The topped-up window survives the checkpoint.
  saved = json.loads(json.dumps(state.to_json()))
  back = state_lib.LoopState.create(c).restored(saved).window
  assert back.envs == window.envs
  np.testing.assert_array_equal(back.mask, window.mask)
  np.testing.assert_array_equal(back.returns, window.returns)


def test_without_top_up_the_pool_stays_as_regenerated(monkeypatch):
  c = _config(**{"designer.top_up": False})
  engine, plays = fakes.FakeEngine(valid=[True, False, True, False]), Plays()
  monkeypatch.setattr(play_phase, "play", plays)
  _, m = _run(c, engine, 3)
  assert [x["designer/top_up"] for x in m] == [0.0, 0.0, 0.0]
  assert engine.sampled == [("designer", 4), ("designer", 2)]
  assert [len(envs) for _, envs, _ in plays.calls] == [2, 2, 2]


def test_a_top_up_designs_nothing_when_the_pool_is_full(monkeypatch):
  c = _config(**{"designer.num_envs": 2})
  engine, plays = fakes.FakeEngine(), Plays()
  monkeypatch.setattr(play_phase, "play", plays)
  _, m = _run(c, engine, 2)
  assert m[1]["designer/top_up"] == 0.0
  assert engine.sampled == [("designer", 2), ("designer", 2)]


def test_top_up_rows_get_the_references_reward_and_train_after_the_delay(
    monkeypatch,
):
  # One active skill, so the top-ups share a centring group. 1 of 4
  # designs is valid at regeneration; iteration 1 tops up 3 (2 valid), and
  # play 1 of the first (environment 1) times out.
  c = _config(
      **{"designer.skills_per_regen": 1, "regret.max_env_reward_scale": 0.0}
  )
  assert c.optim.designer_delay == 1 and c.regret.timeout_penalty == -0.5
  engine = fakes.FakeEngine(
      valid=[True, False, False, False, True, False, True]
  )
  plays = Plays(hangs={1})
  monkeypatch.setattr(play_phase, "play", plays)
  state = state_lib.LoopState.create(c)
  state, _ = loop.iteration(c, engine, engine, state, 0)
  state, m1 = loop.iteration(c, engine, engine, state, 1)
  assert m1["designer/top_up"] == 3.0
  assert len(state.window.envs) == 3 and state.window.timed_out[1]
  # Queued, not trained yet: `optim.designer_delay` iterations later.
  assert engine.updates[-1][1] == []
  assert [it for it, _ in state.delayed] == [1]
  state, _ = loop.iteration(c, engine, engine, state, 2)
  rows = engine.updates[-1][1]
  # Programs 0-3 at regeneration and 4 its hint; the top-ups are 5-7
  # (completion ids end in 6-8). Raw -0.5 (timed out) and 0, centred
  # among the valid top-ups; the one still invalid has no row
  # (designer.invalid_designs="drop").
  assert [r.completion_ids[-1] for r in rows] == [6, 8]
  np.testing.assert_allclose([r.advantage for r in rows], [-0.25, 0.25])
  # Iteration 2 topped up the last one (raw 0, alone: no signal), due next.
  assert [(it, rows) for it, rows in state.delayed] == [(2, (None,))]


def _designs(valid, group=0):
  return [
      records.Design(
          index=i,
          group=group,
          prompt_ids=(1,),
          completion_ids=(2,),
          logprobs=(-0.1,),
          code="x",
          verdict=records.Verdict(ok, "ok" if ok else "smoke"),
          skill="s",
      )
      for i, ok in enumerate(valid)
  ]


def test_top_up_samples_score_as_the_reference_and_weigh_as_a_window():
  c = _config()
  designs = _designs([True, False, True, True])
  # The window's flags: 5 regenerated environments, then the 3 valid
  # top-ups in order; the second top-up's environment timed out.
  timed_out = [True] * 5 + [False, True, False]
  rows, raw = score_lib.top_up_samples(c, designs, timed_out, actor_rows=12)
  np.testing.assert_allclose(raw, [0.0, -1.0, -0.5, 0.0])
  # Weighted min(12 actor rows / 3 designs x interval 5, 50) = 20.
  assert c.designer.regeneration_interval == 5
  mean = -0.5 / 3
  want = [-mean * 20, None, (-0.5 - mean) * 20, -mean * 20]
  got = [None if r is None else r.advantage for r in rows]
  assert got[1] is None
  np.testing.assert_allclose(
      [got[i] for i in (0, 2, 3)], [want[0], want[2], want[3]], 1e-5
  )
  # Ours: an invalid design keeps its row at the invalid penalty.
  c.designer.invalid_designs = "penalize"
  c.regret.max_env_reward_scale = 0.0
  rows, _ = score_lib.top_up_samples(c, designs, timed_out, actor_rows=12)
  mean = (-1.0 - 0.5) / 4
  np.testing.assert_allclose(
      [r.advantage for r in rows],
      [-mean, -1.0 - mean, -0.5 - mean, -mean],
      1e-6,
  )
  assert score_lib.top_up_samples(c, [], timed_out, 12)[0] == []


def test_a_designer_kl_keeps_the_designs_without_signal_as_rows():
  """Under `optim.designer_kl_coef` a design whose advantage is 0 is still
  an update row (its KL term is its gradient): all invalid, none dropped."""
  c = _config()
  designs = _designs([False, False, False])
  timed_out = [False] * 5
  rows, _ = score_lib.top_up_samples(c, designs, timed_out, actor_rows=12)
  assert rows == [None, None, None]
  c.optim.designer_kl_coef = 0.1
  assert score_lib.keeps_unsignalled_designs(c)
  rows, _ = score_lib.top_up_samples(c, designs, timed_out, actor_rows=12)
  assert [r.advantage for r in rows] == [0.0, 0.0, 0.0]
  assert [r.completion_ids for r in rows] == [d.completion_ids for d in designs]
  c.optim.designer_loss_weight = 0.0  # frozen: no KL acts, no rows
  assert not score_lib.keeps_unsignalled_designs(c)


def test_a_window_gains_environments_with_their_earlier_steps_masked():
  env = lambda s: records.Environment(s, "design", None)  # noqa: E731
  window = records.Window.open(0, [env("a")], [])
  window = window.with_plays(
      np.ones((1, 2, 2), np.float32), np.ones((1, 2, 2), bool), [True]
  )
  grown = window.with_envs([records.Environment("b", "top_up", None)])
  assert grown.returns.shape == (2, 1, 2, 2)
  assert grown.mask[0].all() and not grown.mask[1].any()
  np.testing.assert_array_equal(grown.timed_out, [True, False])
  assert window.with_envs([]) is window
  # An empty window's placeholder row is replaced, not kept.
  empty = records.Window.open(0, [], []).with_plays(
      np.zeros((1, 2, 2), np.float32), np.zeros((1, 2, 2), bool), []
  )
  assert empty.with_envs([env("c")]).returns.shape == (1, 1, 2, 2)


def test_the_top_up_switch_is_a_checked_config_key():
  # A config file builds its own tree; validation checks it against the
  # base's, so a switch that is not a bool is refused by name.
  d = _config().to_dict()
  d["designer"]["top_up"] = "yes"
  with pytest.raises(config_lib.ConfigError, match="designer.top_up"):
    config_lib.validate(ml_collections.ConfigDict(d))


def test_a_top_ups_programs_and_verdicts_are_written(monkeypatch, tmp_path):
  c = _config()
  assert c.train.save_programs
  engine = fakes.FakeEngine(valid=[True, False, True, False, True, False])
  plays = Plays()
  monkeypatch.setattr(play_phase, "play", plays)
  # The Trainer's writer alone, without a model or a sandbox.
  trainer = loop.Trainer.__new__(loop.Trainer)
  trainer.config, trainer.workdir = c, str(tmp_path)
  state = state_lib.LoopState.create(c)
  for it in range(2):
    state, _ = loop.iteration(
        c, engine, engine, state, it, on_played=trainer._keep
    )
  folder = tmp_path / "programs" / "iter_000001"
  verdicts = json.loads((folder / "verdicts.json").read_text())
  designs = verdicts["designs"]
  assert [d["file"] for d in designs] == ["design_000.py", "design_001.py"]
  assert [d["verdict"]["valid"] for d in designs] == [True, False]
  assert [d["top_up"] for d in designs] == [True, True]
  # The valid one's raw reward (0: no timeout); the invalid one's penalty.
  assert [d["reward_so_far"] for d in designs] == [0.0, -1.0]
  assert [d["hint"] for d in designs] == [None, None]
  assert "class CountEnv" in (folder / "design_000.py").read_text()
  played = verdicts["played"]
  assert [p["origin"] for p in played] == ["design", "design", "top_up"]
  assert played[2]["return_nohint"] == 0.5 and played[2]["return_hint"] is None
  first = json.loads(
      (tmp_path / "programs" / "iter_000000" / "verdicts.json").read_text()
  )
  assert not any(d["top_up"] for d in first["designs"])
