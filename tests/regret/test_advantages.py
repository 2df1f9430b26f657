"""The agent's advantages follow the reference: z-scored per game."""

import numpy as np

from spade import config as config_lib
from spade.regret import advantages
from spade.regret import scoring


def _scores(config, returns):
  e = returns.shape[0]
  return scoring.make_scorer(config)(
      returns,
      np.ones_like(returns, bool),
      np.ones((e,), bool),
      np.arange(e, dtype=np.int32),  # env i is design i
      np.ones((e,), bool),
      np.zeros((e,), np.int32),
  )


def test_default_agent_advantages_are_z_scores_per_game():
  c = config_lib.base_config()
  assert c.regret.agent_advantage == "normalize"
  assert c.regret.advantage_eps == 1e-8
  returns = np.zeros((2, 4, 2), np.float32)
  returns[0, :, 0] = [1.0, 0.0, 0.0, 0.0]  # mean 0.25, std sqrt(0.1875)
  returns[1, :, 0] = [1.0, -1.0, 1.0, -1.0]  # mean 0, std 1
  adv = np.asarray(_scores(c, returns)["agent_advantages"])
  std = np.sqrt(0.1875)
  np.testing.assert_allclose(
      adv[0, :, 0], [0.75 / std, -0.25 / std, -0.25 / std, -0.25 / std],
      rtol=1e-6,
  )  # fmt: skip
  np.testing.assert_allclose(adv[1, :, 0], [1, -1, 1, -1], rtol=1e-6)
  # The reference's numbers: (r - np.mean) / (np.std + 1e-8).
  want = (returns[0, :, 0] - returns[0, :, 0].mean()) / (
      returns[0, :, 0].std() + 1e-8
  )
  np.testing.assert_allclose(adv[0, :, 0], want, rtol=1e-6)
  # Hinted plays only score the environment (train_on_hinted=False).
  np.testing.assert_array_equal(adv[..., 1], 0.0)


def test_centring_is_the_named_option():
  c = config_lib.base_config()
  c.regret.agent_advantage = "center"
  returns = np.zeros((1, 4, 2), np.float32)
  returns[0, :, 0] = [1.0, 0.0, 0.0, 0.0]
  adv = np.asarray(_scores(c, returns)["agent_advantages"])
  np.testing.assert_allclose(adv[0, :, 0], [0.75, -0.25, -0.25, -0.25])


def test_group_advantages_default_eps():
  r = np.array([2.0, 0.0], np.float32)
  adv = advantages.group_advantages(r, np.zeros(2, np.int32), np.ones(2, bool))
  np.testing.assert_allclose(adv, [1.0, -1.0], rtol=1e-6)
