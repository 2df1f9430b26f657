"""The window's designer rewards and the prompt memory, as the loop runs them."""

import json

import numpy as np
import pytest

from spade import config as config_lib
from spade.selfplay import records
from spade.selfplay import score as score_lib
from spade.selfplay import state as state_lib


def _design(i, skill, valid=True):
  return records.Design(
      index=i, group=0, prompt_ids=(1,), completion_ids=(2,), logprobs=(0.0,),
      code=f"class E{i}Env: pass\n", verdict=records.Verdict(valid, "ok"),
      skill=skill,
  )  # fmt: skip


def _window(designs, steps, hinted):
  """A window whose env e is design e, with unhinted plays per step."""
  envs = [
      records.Environment(d.code, "design", None, design_index=d.index)
      for d in designs
      if d.valid
  ]
  w = records.Window.open(0, envs, designs)
  for s in range(len(steps[0])):
    k = max(len(steps[e][s]) for e in range(len(envs)))
    h = max(len(x) for x in hinted) if s == 0 else 1
    returns = np.zeros((len(envs), max(k, h), 2), np.float32)
    mask = np.zeros_like(returns, bool)
    for e in range(len(envs)):
      plays = steps[e][s]
      returns[e, : len(plays), 0], mask[e, : len(plays), 0] = plays, True
      if s == 0:
        returns[e, : len(hinted[e]), 1] = hinted[e]
        mask[e, : len(hinted[e]), 1] = True
    w = w.with_plays(
        returns, mask, [e == 1 and s == 2 for e in range(len(envs))]
    )
  return w


def window_rewards(c, w, actor_rows):
  """The closing window `w`'s scores and weighted designer advantages, as
  the loop computes them."""
  scores, _ = score_lib.score(c, w, state_lib.LearningPotential(), closes=True)
  return scores, score_lib.designer_advantages(c, w, scores, actor_rows)


def test_window_keeps_plays_by_step_and_round_trips():
  designs = [_design(0, "a"), _design(1, "a")]
  steps = [[[1.0, 0.0], [1.0], [1.0], [0.0]], [[0.0, 0.0], [0.0], [1.0], [0.0]]]
  w = _window(designs, steps, hinted=[[1.0, 1.0], [0.0, 1.0]])
  # R[E, S, K, 2]: env 0's unhinted plays by step, its hinted ones at step 0.
  assert w.returns.shape == (2, 4, 2, 2) and w.widths == (2, 1, 1, 1)
  assert [w.returns[0, s, :, 0][w.mask[0, s, :, 0]].tolist() for s in
          range(4)] == [[1.0, 0.0], [1.0], [1.0], [0.0]]  # fmt: skip
  assert w.returns[0, ..., 1][w.mask[0, ..., 1]].tolist() == [1.0, 1.0]
  assert w.arm_mean(0, 0) == pytest.approx(0.6) and w.arm_mean(1, 1) == 0.5
  assert w.timed_out.tolist() == [False, True]
  back = records.Window.from_json(json.loads(json.dumps(w.to_json())))
  np.testing.assert_array_equal(back.returns, w.returns)
  np.testing.assert_array_equal(back.mask, w.mask)
  np.testing.assert_array_equal(back.timed_out, w.timed_out)
  assert back.widths == w.widths
  # A window is frozen: a step makes a new one.
  with pytest.raises(ValueError):
    w.returns[0, 0, 0, 0] = 5.0


def test_a_window_saved_as_lists_of_returns_loads_as_arrays():
  # Checkpoints written before the array layout kept per environment its
  # [unhinted, hinted] returns and the unhinted ones by step.
  old = {
      "start": 4,
      "envs": [records.Environment("e", "seed", None).to_json()],
      "designs": [],
      "plays": [[[1.0, 0.0, 0.5], [1.0]]],
      "steps": [[[1.0, 0.0], [0.5]]],
      "timed_out": [True],
  }
  w = records.Window.from_json(old)
  assert w.start == 4 and w.returns.shape == (1, 2, 2, 2)
  assert w.returns[0, ..., 0][w.mask[0, ..., 0]].tolist() == [1.0, 0.0, 0.5]
  assert w.returns[0, 0, :, 1][w.mask[0, 0, :, 1]].tolist() == [1.0]
  assert not w.mask[0, 1, :, 1].any() and w.timed_out.tolist() == [True]


def test_blend_on_a_four_step_window_with_matched_timing_and_the_weight():
  c = config_lib.base_config()
  c.designer.regeneration_interval = 4
  designs = [_design(0, "a"), _design(1, "a"), _design(2, "b", valid=False)]
  # Env 0: regeneration step 1/2 unhinted, hinted 2/2; later steps all won.
  # Env 1: regeneration step 0/2, hinted 1/2; later steps 2 of 3 won.
  # Design 2 is invalid: never played.
  steps = [[[1.0, 0.0], [1.0], [1.0], [1.0]], [[0.0, 0.0], [0.0], [1.0], [1.0]]]
  w = _window(designs, steps, hinted=[[1.0, 1.0], [1.0, 0.0]])
  scores, advantages = window_rewards(c, w, actor_rows=6)

  def plateau(p):  # 1 on [0.4, 0.6], falling to 0 over 0.25
    return float(np.clip(1 - max(0.4 - p, p - 0.6, 0) / 0.25, 0, 1))

  # Matched timing: the regret term compares the hinted plays with the
  # regeneration step's unhinted ones only; the plateau takes the window.
  r0 = 0.4 * min((1.0 - 0.5) / 0.15, 1.0) + 0.6 * plateau(4 / 5)
  r1 = 0.4 * min((0.5 - 0.0) / 0.15, 1.0) + 0.6 * plateau(2 / 5)
  assert abs(r0 - r1) > 0.4
  np.testing.assert_allclose(scores.design_reward, [r0, r1, -1.0], 1e-6)
  # Weight: min(6 actor rows / 2 valid designs x 4, 50) = 12; centred per
  # skill over the trained designs; the invalid design has no row.
  mean = (r0 + r1) / 2
  np.testing.assert_allclose(
      advantages, [(r0 - mean) * 12, (r1 - mean) * 12, 0.0], 1e-5,
  )  # fmt: skip
  # Over the whole window ("window", ours) env 1's regret term compares the
  # hinted 1/2 with 2/5: a smaller reward.
  c.regret.timing = "window"
  other, _ = window_rewards(c, w, actor_rows=6)
  np.testing.assert_allclose(
      other.design_reward[1], 0.4 * (0.5 - 0.4) / 0.15 + 0.6, 1e-5
  )


def test_penalize_keeps_an_invalid_design_in_its_skills_group():
  c = config_lib.base_config()
  c.designer.regeneration_interval = 1
  designs = [_design(0, "a"), _design(1, "a"), _design(2, "a", valid=False)]
  steps = [[[1.0, 0.0]], [[0.0, 0.0]]]
  w = _window(designs, steps, hinted=[[1.0, 1.0], [1.0, 0.0]])
  _, dropped = window_rewards(c, w, actor_rows=4)
  assert dropped[2] == 0.0
  c.designer.invalid_designs = "penalize"
  kept, advantages = window_rewards(c, w, actor_rows=4)
  raw = kept.design_reward
  assert raw[2] == c.regret.invalid_penalty
  scale = min(4 / 2 * 1, c.regret.max_env_reward_scale)
  np.testing.assert_allclose(advantages, (raw - raw.mean()) * scale, 1e-5)
  assert advantages[2] < 0 < advantages[0]


def test_regret_based_penalises_a_timed_out_environment():
  c = config_lib.base_config()
  c.regret.window_reward = "regret_based"
  designs = [_design(0, "a"), _design(1, "a")]
  steps = [[[0.0, 0.0], [0.0], [0.0], [0.0]], [[0.0, 0.0], [0.0], [1.0], [0.0]]]
  w = _window(designs, steps, hinted=[[1.0, 1.0], [1.0, 1.0]])
  scores, _ = window_rewards(c, w, actor_rows=0)
  np.testing.assert_allclose(scores.design_reward, [1.0, -0.5])


def _played(env_index, failure=None):
  return records.Episode(
      env_index=env_index, sample=0, hinted=False, seed=0, hint=None,
      first_observation="", turns=(), terminated=failure is None,
      truncated=False, env_failed=failure is not None,
      error=None if failure is None else f"{failure}: the call failed",
      failure=failure,
  )  # fmt: skip


def test_an_environment_whose_call_hung_is_timed_out_and_no_other():
  # The sandbox's reason code and error ("call_timeout: ..."), as a hung
  # step() ends an episode; a crash is not a timeout.
  episodes = [_played(0), _played(1, "call_timeout"), _played(2, "crash")]
  assert score_lib.timed_out(3, episodes) == [False, True, False]


def test_regeneration_plays_fill_the_reference_memory_and_its_prompts():
  c = config_lib.base_config()
  c.grounding.enabled = False
  state = state_lib.LoopState.create(c)
  designs = [_design(0, "logic"), _design(1, "logic"), _design(2, "math")]
  steps = [[[1.0, 0.0]], [[1.0, 1.0]], [[0.0, 1.0]]]
  w = _window(designs, steps, hinted=[[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
  scores, _ = score_lib.score(c, w, state_lib.LearningPotential(), closes=False)
  state.remember_regeneration(0, w, scores)
  assert [r.win_rate for r in state.fifo.records] == [0.5, 1.0, 0.5]
  assert [r.regret for r in state.fifo.records] == [0.5, 0.0, 0.5]
  shown = state.examples(None, 2, "logic")
  # Design 0 is in the band (a positive, with code); design 1 always wins
  # (a negative, shown by name); design 2 is another skill.
  assert [(r.name, r.negative) for r in shown] == [
      ("game_00000_000_logic", False),
      ("game_00000_001_logic", True),
  ]
  assert shown[0].code.startswith('"""SPADE self-play generated game"""')
  saved = json.loads(json.dumps(state.to_json()))
  again = state_lib.LoopState.create(c).restored(saved)
  assert again.fifo.records == state.fifo.records
