"""The curriculum micro-world: levels in the text, rewards, hint, sandbox."""

from __future__ import annotations

import os
import random

import pytest

from spade.environments import levels
from spade.environments import microworld


def _env(level, hinted=False):
  scope = {}
  exec(microworld.program("lock", level, 3), scope)  # pylint: disable=exec-used
  env = scope["DigitLockEnv"]()
  env.reset(seed=0)
  if hinted:
    env.hint()
  return env


def _wins(env, action):
  env.reset(seed=0)
  return env.step(action)[1]


@pytest.mark.parametrize("level", microworld.LEVELS)
def test_level_is_in_the_text_and_binary_reward(level):
  src = microworld.program("safe", level, 7)
  assert microworld.level_of(src) == level
  env = _env(level)
  assert _wins(env, "7" * level) == 1.0
  assert _wins(env, "7" * (level - 1) + "x") == 0.0
  assert _wins(env, "") == 0.0


def test_hint_halves_a_level_without_solving_it():
  for level in microworld.LEVELS:
    plain, hinted = _env(level), _env(level, hinted=True)
    half = "7" * ((level + 1) // 2)
    hinted.reset(seed=0)
    hinted.hint()
    assert hinted.step(half)[1] == 1.0
    hinted.reset(seed=0)
    hinted.hint()
    assert hinted.step("7" * ((level + 1) // 2 - 1) + "x")[1] == 0.0
    assert hinted.hint() == ""  # the hint is not the answer
    # Easier than the plain level above level 1, where it gives nothing.
    assert _wins(plain, half) == float(level == 1)


def test_random_bytes_win_easy_levels_rarely_and_hard_ones_never():
  rng = random.Random(0)
  alphabet = [chr(i) for i in range(256)]
  rates = {}
  for level in (1, 2, 6):
    env = _env(level)
    wins = sum(
        _wins(env, "".join(rng.choice(alphabet) for _ in range(8)).strip())
        for _ in range(20_000)
    )
    rates[level] = wins / 20_000
  assert 0.01 < rates[1] < 0.1, rates
  assert rates[2] < 0.01, rates
  assert rates[6] == 0.0, rates


def test_registered_family_and_written_pools():
  fam = levels.get(microworld.FAMILY)
  assert tuple(fam.names) == microworld.NAMES
  assert microworld.level_of(fam.program("vault", 4, 1)) == 4
  with pytest.raises(ValueError):
    fam.program("vault", 0, 1)
  train = {
      open(os.path.join(microworld.TRAIN_DIR, n)).read()
      for n in os.listdir(microworld.TRAIN_DIR)
  }
  heldout = [
      open(os.path.join(microworld.HELDOUT_DIR, n)).read()
      for n in os.listdir(microworld.HELDOUT_DIR)
  ]
  assert {microworld.level_of(s) for s in heldout} == set(microworld.LEVELS)
  assert not train & set(heldout)  # held out means never trained on


@pytest.mark.sandbox
def test_every_level_validates_in_the_sandbox():
  from spade.sandbox import pool as pool_lib  # pylint: disable=g-import-not-at-top

  sources = [
      microworld.program(n, lv, 5)
      for n in microworld.NAMES
      for lv in microworld.LEVELS
  ]
  with pool_lib.SandboxPool(
      "gvisor", 1, preload=(), warm_spare=False, spare_envs=0
  ) as pool:
    verdicts = pool.validate(sources)
  assert all(v["valid"] for v in verdicts), [
      v["reason"] for v in verdicts if not v["valid"]
  ]
