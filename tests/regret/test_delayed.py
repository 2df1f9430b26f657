"""Window designer rewards: matched timing, the weight, the variants."""

import numpy as np
import pytest

from spade.regret import delayed


def _window():
  """2 environments x 4 steps x 2 plays; 2 hinted plays each."""
  w = np.zeros((2, 4, 2), np.float32)
  w[0] = [[0, 0], [1, 0], [1, 0], [1, 1]]  # learns over the window
  w[1] = 1.0  # always won
  h = np.array([[1, 0], [1, 1]], np.float32)
  return w, np.ones_like(w, bool), h, np.ones_like(h, bool)


def test_blend_on_a_four_step_window_with_matched_timing_and_the_weight():
  w, wm, h, hm = _window()
  raw = np.asarray(delayed.blend(w, wm, h, hm))
  # Env 0: r_hint 0.5 vs the regeneration step's 0.0 -> regret term
  # clip(0.5 / 0.15) = 1; window win rate 4/8 = 0.5 -> plateau 1.
  # Env 1: no gap; win rate 1 -> plateau max(0, 1 - 0.4 / 0.25) = 0.
  np.testing.assert_allclose(raw, [0.4 + 0.6, 0.0], atol=1e-6)
  # Ours before: the unhinted arm over the whole window (0.5): no regret.
  ours = np.asarray(delayed.blend(w, wm, h, hm, timing="window"))
  np.testing.assert_allclose(ours, [0.6, 0.0], atol=1e-6)
  # 192 actor rows, 24 designs, interval 4: weight 32; capped at 50.
  scale = delayed.env_reward_scale(192, 24, 4)
  assert scale == 32.0
  assert delayed.env_reward_scale(192, 2, 4) == 50.0
  assert delayed.env_reward_scale(192, 0, 4) == 1.0
  assert delayed.env_reward_scale(192, 24, 4, max_scale=0) == 1.0
  skill = np.array([0, 0], np.int32)
  adv = delayed.centre_per_skill(raw, skill, np.ones(2, bool), scale)
  np.testing.assert_allclose(adv, [16.0, -16.0], atol=1e-5)
  # A design left out (invalid) joins no skill mean.
  adv = delayed.centre_per_skill(raw, skill, np.array([True, False]), scale)
  np.testing.assert_allclose(adv, [0.0, 0.0], atol=1e-6)


def test_matched_timing_takes_the_first_step_with_plays():
  w, wm, h, hm = _window()
  wm[0, 0] = False  # no plays at the regeneration step: offset 1 is first
  np.testing.assert_allclose(delayed.matched_nohint(w, wm), [0.5, 1.0])


def test_regret_based_micro_lp_and_solve_rate():
  w, wm, h, hm = _window()
  timed_out = np.array([False, True])
  np.testing.assert_allclose(
      delayed.regret_based(w, wm, h, hm, timed_out), [0.0, -0.5]
  )
  # Env 0: early steps {0, 1} 1/4, late {2, 3} 3/4.
  np.testing.assert_allclose(delayed.micro_lp(w, wm), [0.5, 0.0])
  wm[0, 1:] = False  # one step with plays: no improvement to measure
  np.testing.assert_allclose(delayed.micro_lp(w, wm), [0.0, 0.0])
  w, wm, h, hm = _window()
  np.testing.assert_allclose(delayed.solve_rate(w, wm), [1.0, 0.0])


def test_learning_potential_tracks_each_skill():
  w, wm, _, _ = _window()
  skill = np.array([0, 0], np.int32)
  state = delayed.lp_init(2)
  raw, state = delayed.learning_potential(w, wm, skill, state)
  # Skill 0's window mean 12/16 = 0.75 sets both trackers.
  np.testing.assert_allclose(raw, [0.25, 0.25], atol=1e-6)
  assert bool(state.seen[0]) and not bool(state.seen[1])
  raw, state = delayed.learning_potential(np.zeros_like(w), wm, skill, state)
  # mu_slow = 0.15 * 0.75 + 0.85 * 0; mu_fast = 0.02 * 0.75.
  assert float(state.mu_slow[0]) == pytest.approx(0.1125)
  assert float(state.mu_fast[0]) == pytest.approx(0.015)
  np.testing.assert_allclose(raw, [0.1125, 0.1125], atol=1e-6)
