"""The one jitted scorer (`spade.regret.scoring`) against hand-computed values.

One small iteration, E=3 environments with K=2 episodes per arm (arm 0 no
hint, arm 1 hint), N=4 designs:

  env 0 (valid, design 0):  no hint [0, 0]   hint [1, 1]
  env 1 (valid, design 2):  no hint [1, 0]   hint [0, -]   (- = masked)
  env 2 (invalid, no design): every episode 0.5

  designs: valid [T, F, T, F], skill groups [0, 0, 0, 1]

Hint regret is max(0, hinted mean - unhinted mean): env 0 gets 1 and env 1
gets 0 (0 - 0.5 floored). With the arms swapped env 0 would get 0 and env 1
0.5, so every value below that depends on regret catches the swap.
"""

import numpy as np
import pytest

from spade import config as config_lib
from spade.regret import scoring

NAN = float("nan")
PENALTY = -1.0


def _config(**overrides):
  c = config_lib.base_config()
  c.regret.estimator = "hint"  # the designer reward is the hint regret
  c.regret.invalid_penalty = PENALTY
  c.regret.designer_advantage = "center"
  c.regret.agent_advantage = "center"
  c.regret.separate_arms = False
  c.agent.train_on_hinted = True
  c.designer.invalid_designs = "drop"
  for dotted, value in overrides.items():
    section, key = dotted.split("__")
    c[section][key] = value
  return c


def _inputs():
  returns = np.full((3, 2, 2), NAN, np.float32)
  mask = np.zeros((3, 2, 2), bool)
  returns[0, :, 0], returns[0, :, 1] = [0, 0], [1, 1]
  mask[0] = True
  returns[1, :, 0], returns[1, :, 1] = [1, 0], [0, NAN]
  mask[1, :, 0], mask[1, :, 1] = [True, True], [True, False]
  returns[2] = 0.5
  mask[2] = True
  valid = np.array([True, True, False])
  design_of_env = np.array([0, 2, -1], np.int32)
  design_valid = np.array([True, False, True, False])
  design_group = np.array([0, 0, 0, 1], np.int32)
  return returns, mask, valid, design_of_env, design_valid, design_group


def _score(**overrides):
  out = scoring.make_scorer(_config(**overrides))(*_inputs())
  return {k: np.asarray(v) for k, v in out.items()}


def test_regret_and_env_score_follow_the_hint_gap():
  out = _score()
  np.testing.assert_allclose(out["regret"], [1.0, 0.0, 0.0])
  # The hint estimator's reward is the regret; the invalid env gets the
  # penalty.
  np.testing.assert_allclose(out["env_score"], [1.0, 0.0, PENALTY])


def test_summary_scalars_count_only_valid_unmasked_episodes():
  out = _score()
  assert out["num_episodes"] == 7  # env 2 is invalid, one episode masked
  np.testing.assert_allclose(out["return_nohint"], 1 / 4)  # 0, 0, 1, 0
  np.testing.assert_allclose(out["return_hint"], 2 / 3)  # 1, 1, 0
  np.testing.assert_allclose(out["regret_mean"], 0.5)  # (1 + 0) / 2


def test_design_reward_lands_on_each_design():
  out = _score()
  # Design 0 <- env 0, design 2 <- env 1; invalid designs get the penalty.
  np.testing.assert_allclose(out["design_reward"], [1.0, PENALTY, 0.0, PENALTY])


def test_designer_advantages_drop_or_keep_invalid_designs():
  # drop: group 0 is designs {0, 2} (rewards 1, 0, mean 0.5); design 1 is
  # left out and design 3's group has no valid member.
  np.testing.assert_allclose(
      _score()["designer_advantages"], [0.5, 0.0, -0.5, 0.0]
  )
  # penalize: design 1 stays in group 0 with the penalty (1, -1, 0: mean
  # 0); design 3 is alone in its group, so it gets 0.
  np.testing.assert_allclose(
      _score(designer__invalid_designs="penalize")["designer_advantages"],
      [1.0, -1.0, 0.0, 0.0],
  )


def test_agent_advantages_centre_both_arms_per_environment():
  adv = _score()["agent_advantages"]
  # env 0: mean of 0, 0, 1, 1 is 0.5.
  np.testing.assert_allclose(adv[0], [[-0.5, 0.5], [-0.5, 0.5]])
  # env 1: mean of 1, 0, 0 is 1/3; the masked episode gets 0.
  np.testing.assert_allclose(
      adv[1], [[2 / 3, -1 / 3], [-1 / 3, 0.0]], rtol=1e-6
  )
  # env 2: a constant group carries no signal.
  np.testing.assert_allclose(adv[2], 0.0)


def test_agent_advantages_normalised_by_the_environment_std():
  adv = _score(regret__agent_advantage="normalize")["agent_advantages"]
  # env 0: std of 0, 0, 1, 1 is 0.5.
  np.testing.assert_allclose(adv[0], [[-1, 1], [-1, 1]], rtol=1e-6)
  std = np.std([1.0, 0.0, 0.0])
  np.testing.assert_allclose(
      adv[1],
      [[(2 / 3) / std, (-1 / 3) / std], [(-1 / 3) / std, 0.0]],
      rtol=1e-5,
  )


def test_without_hinted_training_only_the_unhinted_arm_learns():
  adv = _score(agent__train_on_hinted=False)["agent_advantages"]
  # The hint arm is zeroed; the unhinted arm is baselined on itself: env 0's
  # is constant (0, 0), env 1's is 1, 0 around 0.5. Swapping the arms would
  # zero the unhinted column instead.
  np.testing.assert_allclose(adv[..., 1], 0.0)
  np.testing.assert_allclose(adv[0, :, 0], [0.0, 0.0])
  np.testing.assert_allclose(adv[1, :, 0], [0.5, -0.5])
  np.testing.assert_allclose(adv[2], 0.0)


@pytest.mark.parametrize("estimator", ["hint", "reference"])
def test_scorer_is_built_once_per_config(estimator):
  a = scoring.make_scorer(_config(regret__estimator=estimator))
  b = scoring.make_scorer(_config(regret__estimator=estimator))
  assert a is b
