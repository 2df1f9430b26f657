"""The named budgets (`sandbox.budgets`) and how a config resolves them."""

import pytest

from spade import config as config_lib
from spade.environments import budget
from spade.environments import sandboxes


def test_reference_budgets_are_the_reference_limits():
  ref = budget.resolve("reference", max_context_tokens=24576)
  # ENV_STEP_TIMEOUT = 30 (load + reset, each step); VALIDATE_GAME_TIMEOUT =
  # 60 for the validator, within a hard deadline of 75 s.
  assert ref == budget.Budgets(30.0, 75.0, 30.0, 24576 * 8)
  assert budget.resolve("reference").max_output_chars == 32768 * 8
  assert budget.resolve("strict") == budget.Budgets(0.5, 30.0, 5.0, 65_536)
  # An explicit key (> 0) replaces the named value.
  assert budget.resolve("strict", call_timeout_s=2.0).call_timeout_s == 2.0
  with pytest.raises(ValueError, match="sandbox.budgets"):
    budget.resolve("lenient")


@pytest.mark.parametrize(
    "name, call_s, load_s, validate_s",
    [("reference", 30.0, 30.0, 75.0), ("strict", 0.5, 5.0, 30.0)],
)
def test_pool_from_config_takes_the_named_budgets(
    name, call_s, load_s, validate_s
):
  config = config_lib.base_config()
  config.sandbox.budgets = name
  config.sandbox.backend = "none"
  config.sandbox.num_sandboxes = 1
  config.sandbox.preload = ()
  config.sandbox.warm_spare = False
  config_lib.validate(config)
  with sandboxes.from_config(config.sandbox) as pool:
    o = pool.options
    assert (o.call_timeout_s, o.step_timeout_s, o.validate_timeout_s) == (
        call_s,
        load_s,
        validate_s,
    )


def test_config_refuses_unknown_budgets_and_negative_limits():
  config = config_lib.base_config()
  config.sandbox.budgets = "lenient"
  with pytest.raises(config_lib.ConfigError, match="sandbox.budgets"):
    config_lib.validate(config)
  config = config_lib.base_config()
  config.sandbox.call_timeout_s = -1.0
  with pytest.raises(config_lib.ConfigError, match="call_timeout_s"):
    config_lib.validate(config)
