"""Regret estimators and advantages against hand-computed values."""

import statistics

import numpy as np
import pytest

from spade import config as config_lib
from spade.regret import advantages
from spade.regret import delayed
from spade.regret import estimators

NAN = float("nan")


def _batch():
  """Four environments, K=3; NaNs sit only where the mask is False.

  env 0: no hint [0, 1, 0], hint [1, 1, 0]          (all exist)
  env 1: no hint [1, -, 0.5], hint [0, 0, -]        (- = masked)
  env 2: nothing exists
  env 3: invalid
  """
  r = np.full((4, 3, 2), NAN, np.float32)
  m = np.zeros((4, 3, 2), bool)
  r[0, :, 0], r[0, :, 1] = [0, 1, 0], [1, 1, 0]
  m[0] = True
  r[1, :, 0], r[1, :, 1] = [1, NAN, 0.5], [0, 0, NAN]
  m[1, :, 0], m[1, :, 1] = [True, False, True], [True, True, False]
  r[3] = 0.5
  m[3] = True
  valid = np.array([True, True, True, False])
  return r, m, valid


def _reward(name, **overrides):
  cfg = config_lib.base_config().regret
  for k, v in overrides.items():
    cfg[k] = v
  return estimators.designer_reward(name, cfg)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("hint", [1 / 3, 0.0, 0.0, -1.0]),
        ("max", [1 - 1 / 3, -0.75, 0.0, -1.0]),
        ("learnability", [2 / 9, 0.1875, 0.0, -1.0]),
        # 0.4 * clip((2/3 - 1/3) / 0.15) + 0.6 * (1 - (0.4 - 1/3) / 0.25);
        # env 1: gap < 0 -> 0, plateau(0.75) = 1 - 0.15 / 0.25 = 0.4.
        ("reference", [0.4 + 0.6 * (1 - (0.4 - 1 / 3) / 0.25), 0.24, 0, -1]),
    ],
)
def test_estimators_with_masks_and_degenerate_groups(name, expected):
  r, m, valid = _batch()
  out = np.asarray(_reward(name)(r, m, valid))
  assert out.dtype == np.float32
  np.testing.assert_allclose(out, expected, atol=1e-6)


def test_invalid_penalty_is_configured():
  r, m, valid = _batch()
  out = np.asarray(_reward("hint", invalid_penalty=-0.25)(r, m, valid))
  np.testing.assert_allclose(out[3], -0.25)


def test_single_episode_and_one_empty_arm():
  r = np.array([[[0.5, 0.6]], [[0.2, 0.9]]], np.float32)  # K=1
  m = np.array([[[True, True]], [[True, False]]])  # env 1: no hint arm
  valid = np.array([True, True])
  np.testing.assert_allclose(_reward("hint")(r, m, valid), [0.1, 0.0], 1e-6)
  np.testing.assert_allclose(_reward("max")(r, m, valid), [0.1, 0.0], 1e-6)
  np.testing.assert_allclose(
      _reward("reference")(r, m, valid),
      [0.4 * 0.1 / 0.15 + 0.6, 0.0 + 0.6 * (1 - (0.4 - 0.2) / 0.25)],
      atol=1e-6,
  )
  np.testing.assert_allclose(
      _reward("learnability")(r, m, valid), [0.25, 0.16], 1e-6
  )


def test_all_equal_returns():
  r = np.ones((2, 4, 2), np.float32)
  m = np.ones((2, 4, 2), bool)
  valid = np.ones(2, bool)
  for name, want in [("hint", 0), ("max", 0), ("learnability", 0)]:
    np.testing.assert_allclose(_reward(name)(r, m, valid), [want] * 2)
  # Win rate 1 is 0.4 past the plateau: 1 - 0.4 / 0.25 < 0 -> 0.
  np.testing.assert_allclose(_reward("reference")(r, m, valid), [0, 0])


def test_plateau_shape():
  rates = np.array([0.0, 0.15, 0.3, 0.4, 0.5, 0.6, 0.7, 0.85, 1.0])
  np.testing.assert_allclose(
      estimators.plateau(rates), [0, 0, 0.6, 1, 1, 1, 0.6, 0, 0], atol=1e-6
  )


def test_beta_lcb_against_closed_form():
  k = 10
  r = np.zeros((3, k, 2), np.float32)
  r[0, :, 1] = 1.0  # never without the hint, always with it
  r[1, :, 1] = 1.0
  r[1, 5:, 0] = 1.0  # 5 of 10 without the hint
  m = np.ones((3, k, 2), bool)
  m[2] = False
  valid = np.ones(3, bool)
  z = statistics.NormalDist().inv_cdf(0.1)

  def beta(a, b):
    return a / (a + b), a * b / ((a + b) ** 2 * (a + b + 1))

  hint_mean, hint_var = beta(11, 1)
  want = []
  for wins in (0, 5):
    mean, var = beta(1 + wins, 1 + k - wins)
    want.append(max(0.0, hint_mean - mean + z * (hint_var + var) ** 0.5))
  want.append(0.0)
  assert want[0] == pytest.approx(0.6944, abs=1e-4)
  out = _reward("lcb", lcb_quantile=0.1)(r, m, valid)
  np.testing.assert_allclose(out, want, atol=1e-5)
  # A wider bound (smaller quantile) can only lower the score.
  tighter = _reward("lcb", lcb_quantile=0.01)(r, m, valid)
  assert np.all(np.asarray(tighter) <= np.asarray(out))
  assert float(tighter[0]) < float(out[0])


def test_unknown_estimator_and_bad_shapes_say_what_to_do():
  with pytest.raises(ValueError, match="config.regret.estimator"):
    estimators.designer_reward("nope")
  fn = estimators.designer_reward("hint")
  with pytest.raises(ValueError, match=r"f32\[E, K, 2\]"):
    fn(np.zeros((2, 3)), np.ones((2, 3), bool), np.ones(2, bool))


def test_the_configs_choices_are_the_registries():
  # A name registered beside its code is a valid config value: the config
  # reads the registries, it keeps no list of its own.
  choices = config_lib.choices()
  assert choices["regret.estimator"] == estimators.estimator_names()
  assert choices["regret.window_reward"] == delayed.window_reward_names()
  assert set(choices["regret.window_reward"]) == {
      "blend", "regret_based", "micro_lp", "solve_rate", "learning_potential"
  }  # fmt: skip
  assert choices["train.mode"] == ("spade", "fixed_pool", "adaptive")


def test_summarize_ignores_invalid_and_masked():
  r, m, valid = _batch()
  s = {k: float(v) for k, v in estimators.summarize(r, m, valid).items()}
  # No hint: env0 [0,1,0] + env1 [1,0.5] -> 2.5/5; hint: [1,1,0] + [0,0] -> 2/5
  assert s["return_nohint"] == pytest.approx(0.5)
  assert s["return_hint"] == pytest.approx(0.4)
  assert s["regret_mean"] == pytest.approx((1 / 3) / 3)
  assert s["num_episodes"] == 10


def test_agent_advantages_per_environment_group():
  r = np.zeros((3, 2, 2), np.float32)
  m = np.ones((3, 2, 2), bool)
  r[0, :, 0], r[0, :, 1] = [1, 0], [1, 1]  # mean .75, std sqrt(.1875)
  r[1] = 0.3  # constant group
  m[2] = False
  m[2, 0, 0] = True  # singleton group
  r[2, 0, 0] = 1.0
  adv = np.asarray(advantages.agent_advantages(r, m))
  hi, lo = 0.25 / np.sqrt(0.1875), -0.75 / np.sqrt(0.1875)
  np.testing.assert_allclose(adv[0], [[hi, hi], [lo, hi]], rtol=1e-5)
  np.testing.assert_array_equal(adv[1:], 0.0)
  per_arm = np.asarray(advantages.agent_advantages(r, m, separate_arms=True))
  np.testing.assert_allclose(per_arm[0], [[1, 0], [-1, 0]], atol=1e-5)


def test_group_advantages_by_grounding_group():
  rewards = np.array([1.0, 0.0, 5.0, 2.0, 2.0, 7.0, NAN], np.float32)
  ids = np.array([3, 3, 9, 4, 4, 3, 3])
  mask = np.array([True, True, True, True, True, True, False])
  adv = np.asarray(advantages.group_advantages(rewards, ids, mask))
  # Group 3 = {1, 0, 7}: mean 8/3, population std sqrt(26/9).
  std = np.sqrt(((1 - 8 / 3) ** 2 + (8 / 3) ** 2 + (7 - 8 / 3) ** 2) / 3)
  want = [(1 - 8 / 3) / std, -8 / 3 / std, 0, 0, 0, (7 - 8 / 3) / std, 0]
  np.testing.assert_allclose(adv, want, rtol=1e-5, atol=1e-6)


def test_no_environments_and_cached_functions():
  fn = _reward("reference")
  assert fn is _reward("reference")  # one compiled function per setting
  out = fn(np.zeros((0, 2, 2)), np.zeros((0, 2, 2), bool), np.zeros(0, bool))
  assert out.shape == (0,)
  s = estimators.summarize(
      np.zeros((0, 2, 2)), np.zeros((0, 2, 2), bool), np.zeros(0, bool)
  )
  assert float(s["regret_mean"]) == 0.0 and float(s["return_hint"]) == 0.0
