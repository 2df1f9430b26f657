"""The skill ladder: level in the text, one letter a rung, the hint, sandbox."""

from __future__ import annotations

import os
import random

import pytest

from spade.environments import ladder
from spade.environments import levels


def _play(level, reply, hinted=False):
  scope = {}
  exec(ladder.program(level), scope)  # pylint: disable=exec-used
  env = scope["LadderEnv"]()
  observation, _ = env.reset(seed=0)
  assert observation == ladder.observation(level)
  if hinted:
    assert env.hint() == ""  # the hint acts on the environment only
  return env.step(reply)[1]


@pytest.mark.parametrize("level", ladder.LEVELS)
def test_level_is_in_the_text_and_only_the_prefix_pays(level):
  src = ladder.program(level)
  assert ladder.level_of(src) == level
  assert ladder.keeps_secret(src)
  assert _play(level, ladder.SECRET[:level]) == 1.0
  assert _play(level, ladder.SECRET) == 1.0  # what follows does not matter
  assert _play(level, ladder.SECRET[: level - 1]) == 0.0  # one short
  wrong = "a" if ladder.SECRET[level - 1] != "a" else "b"
  assert _play(level, ladder.SECRET[: level - 1] + wrong) == 0.0
  assert _play(level, "") == 0.0


def test_the_hint_lowers_the_requirement_by_exactly_one_letter():
  for level in ladder.LEVELS:
    k = level - 1
    assert _play(level, ladder.SECRET[:k], hinted=True) == 1.0
    if k:
      assert _play(level, ladder.SECRET[: k - 1], hinted=True) == 0.0
    # The host's rule is the program's.
    for reply in (ladder.SECRET[:k], ladder.SECRET[:level], "d" * level):
      for hinted in (False, True):
        assert _play(level, reply, hinted) == float(
            ladder.wins(reply, level, hinted)
        )


def test_no_transfer_between_rungs():
  # Letter L + 1 changes no reward below level L + 1: every reply that
  # differs from the secret only there wins and loses the same levels.
  for pos in range(len(ladder.SECRET)):
    for other in ladder.ALPHABET:
      reply = ladder.SECRET[:pos] + other + ladder.SECRET[pos + 1 :]
      for level in ladder.LEVELS:
        if level <= pos:
          assert ladder.wins(reply, level) == ladder.wins(ladder.SECRET, level)
  # Never the same letter twice in a row, each letter equally often.
  s = ladder.SECRET
  assert all(a != b for a, b in zip(s, s[1:]))
  assert {s.count(c) for c in ladder.ALPHABET} == {len(s) // 4}


def test_random_letters_win_one_rung_in_four_and_high_rungs_never():
  rng = random.Random(0)
  rates = {}
  for level in (1, 2, 8):
    wins = sum(
        ladder.wins(
            "".join(rng.choice(ladder.ALPHABET) for _ in range(16)), level
        )
        for _ in range(20_000)
    )
    rates[level] = wins / 20_000
  assert abs(rates[1] - 0.25) < 0.02, rates
  assert abs(rates[2] - 1 / 16) < 0.01, rates
  assert rates[8] < 0.001, rates


def test_registered_family_and_written_pool():
  fam = levels.get(ladder.FAMILY)
  assert tuple(fam.names) == ladder.NAMES
  assert fam.program("ladder", 12, 5) == ladder.program(12)
  with pytest.raises(ValueError):
    fam.program("ladder", 0, 1)
  with pytest.raises(ValueError):
    fam.program("rope", 3, 1)
  pool = {}
  for name in sorted(os.listdir(ladder.TRAIN_DIR)):
    with open(os.path.join(ladder.TRAIN_DIR, name)) as f:
      pool[name] = f.read()
  assert [ladder.level_of(s) for s in pool.values()] == list(ladder.LEVELS)
  assert all(s == ladder.program(ladder.level_of(s)) for s in pool.values())
  changed = ladder.program(3).replace(ladder.SECRET, "abcd" * 4)
  assert ladder.level_of(changed) == 3 and not ladder.keeps_secret(changed)


@pytest.mark.sandbox
def test_every_level_validates_in_the_sandbox():
  from spade.sandbox import pool as pool_lib  # pylint: disable=g-import-not-at-top

  sources = [ladder.program(level) for level in ladder.LEVELS]
  with pool_lib.SandboxPool(
      "gvisor", 1, preload=(), warm_spare=False, spare_envs=0
  ) as pool:
    verdicts = pool.validate(sources)
  assert all(v["valid"] for v in verdicts), [
      v["reason"] for v in verdicts if not v["valid"]
  ]
  assert all(v["properties"]["has_hint"] for v in verdicts)


def test_every_curriculum_arm_validates():
  from configs import curriculum  # pylint: disable=g-import-not-at-top
  from spade import config as config_lib  # pylint: disable=g-import-not-at-top

  longest = max(len(ladder.program(level)) for level in ladder.LEVELS)
  for arm in curriculum.ARMS + ("smoke",):
    c = curriculum.get_config(arm)
    config_lib.validate(c)
    # The update's rows and the slot engine's cache hold a whole program,
    # and a reply holds the whole secret.
    assert c.designer.max_prompt_tokens + longest + 1 <= c.model.max_len
    assert longest + 1 <= c.designer.max_new_tokens or arm == "smoke"
    assert c.agent.max_new_tokens > len(ladder.SECRET)
  assert curriculum.get_config("uniform").agent.play_hinted is False
  assert curriculum.get_config("scripted").agent.play_hinted is False
  with pytest.raises(ValueError):
    curriculum.get_config("nope")
