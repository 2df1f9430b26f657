"""Regret estimators, designer rewards and per-role advantages (pure jnp).

`designer_reward(config.regret.estimator, config.regret)` gives the jitted
fn(returns f32[E, K, 2], mask bool[E, K, 2], valid bool[E]) -> f32[E];
`agent_advantages` and `group_advantages` normalise rewards per group.
"""

from spade.regret.advantages import agent_advantages
from spade.regret.advantages import group_advantages
from spade.regret.estimators import designer_reward
from spade.regret.estimators import ESTIMATORS
from spade.regret.estimators import summarize
