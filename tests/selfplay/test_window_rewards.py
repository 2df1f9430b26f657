"""The window's designer rewards and the prompt memory, as the loop runs them."""

import json

import numpy as np

from spade import config as config_lib
from spade.selfplay import curriculum as curriculum_lib
from spade.selfplay import records
from spade.selfplay import score as score_lib


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
  w = records.Window(0, envs, designs, [[[], []] for _ in envs])
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


def _scores(n_designs):
  z = np.zeros((n_designs,), np.float32)
  return records.Scores(
      returns=np.zeros((1, 1, 2)), mask=np.zeros((1, 1, 2), bool),
      regret=z, env_score=z, design_reward=z, designer_advantages=z,
      agent_advantages=np.zeros((1, 1, 2)), summary={},
  )  # fmt: skip


def test_window_keeps_plays_by_step_and_round_trips():
  designs = [_design(0, "a"), _design(1, "a")]
  steps = [[[1.0, 0.0], [1.0], [1.0], [0.0]], [[0.0, 0.0], [0.0], [1.0], [0.0]]]
  w = _window(designs, steps, hinted=[[1.0, 1.0], [0.0, 1.0]])
  assert w.steps[0] == [[1.0, 0.0], [1.0], [1.0], [0.0]]
  assert w.plays[0][0] == [1.0, 0.0, 1.0, 1.0, 0.0] and w.plays[0][1] == [1, 1]
  assert w.timed_out == [False, True]
  back = records.Window.from_json(json.loads(json.dumps(w.to_json())))
  assert (back.plays, back.steps, back.timed_out) == (
      w.plays,
      w.steps,
      w.timed_out,
  )


def test_blend_on_a_four_step_window_with_matched_timing_and_the_weight():
  c = config_lib.base_config()
  c.designer.regeneration_interval = 4
  designs = [_design(0, "a"), _design(1, "a"), _design(2, "b", valid=False)]
  # Env 0: regeneration step 1/2 unhinted, hinted 2/2; later steps all won.
  # Env 1: regeneration step 0/2, hinted 1/2; later steps 2 of 3 won.
  # Design 2 is invalid: never played.
  steps = [[[1.0, 0.0], [1.0], [1.0], [1.0]], [[0.0, 0.0], [0.0], [1.0], [1.0]]]
  w = _window(designs, steps, hinted=[[1.0, 1.0], [1.0, 0.0]])
  scores, _ = score_lib.window_rewards(c, w, _scores(3), actor_rows=6)

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
      scores.designer_advantages, [(r0 - mean) * 12, (r1 - mean) * 12, 0.0],
      1e-5,
  )  # fmt: skip
  # Over the whole window ("window", ours) env 1's regret term compares the
  # hinted 1/2 with 2/5: a smaller reward.
  c.regret.timing = "window"
  other, _ = score_lib.window_rewards(c, w, _scores(3), actor_rows=6)
  np.testing.assert_allclose(
      other.design_reward[1], 0.4 * (0.5 - 0.4) / 0.15 + 0.6, 1e-5
  )


def test_penalize_keeps_an_invalid_design_in_its_skills_group():
  c = config_lib.base_config()
  c.designer.regeneration_interval = 1
  designs = [_design(0, "a"), _design(1, "a"), _design(2, "a", valid=False)]
  steps = [[[1.0, 0.0]], [[0.0, 0.0]]]
  w = _window(designs, steps, hinted=[[1.0, 1.0], [1.0, 0.0]])
  dropped, _ = score_lib.window_rewards(c, w, _scores(3), actor_rows=4)
  assert dropped.designer_advantages[2] == 0.0
  c.designer.invalid_designs = "penalize"
  kept, _ = score_lib.window_rewards(c, w, _scores(3), actor_rows=4)
  raw = kept.design_reward
  assert raw[2] == c.regret.invalid_penalty
  scale = min(4 / 2 * 1, c.regret.max_env_reward_scale)
  np.testing.assert_allclose(
      kept.designer_advantages, (raw - raw.mean()) * scale, 1e-5
  )
  assert kept.designer_advantages[2] < 0 < kept.designer_advantages[0]


def test_regret_based_penalises_a_timed_out_environment():
  c = config_lib.base_config()
  c.regret.window_reward = "regret_based"
  designs = [_design(0, "a"), _design(1, "a")]
  steps = [[[0.0, 0.0], [0.0], [0.0], [0.0]], [[0.0, 0.0], [0.0], [1.0], [0.0]]]
  w = _window(designs, steps, hinted=[[1.0, 1.0], [1.0, 1.0]])
  scores, _ = score_lib.window_rewards(c, w, _scores(2), actor_rows=0)
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
  state = curriculum_lib.LoopState(c)
  designs = [_design(0, "logic"), _design(1, "logic"), _design(2, "math")]
  steps = [[[1.0, 0.0]], [[1.0, 1.0]], [[0.0, 1.0]]]
  w = _window(designs, steps, hinted=[[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
  returns, mask = w.arrays()
  scores = records.Scores(
      returns=returns, mask=mask, regret=np.zeros(3), env_score=np.zeros(3),
      design_reward=np.zeros(3), designer_advantages=np.zeros(3),
      agent_advantages=np.zeros_like(returns), summary={},
  )  # fmt: skip
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
  saved = json.loads(json.dumps(state.state()))
  again = curriculum_lib.LoopState(c)
  again.load(saved)
  assert again.fifo.records == state.fifo.records
