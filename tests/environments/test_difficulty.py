"""The sliding-window controller on a scripted accuracy sequence."""

import json

import pytest

from spade.environments import difficulty


def _block(env, level, wins, n=128):
  return [(env, level, 1.0 if i < wins else 0.0) for i in range(n)]


def test_promotions_and_window_on_a_scripted_sequence():
  c = difficulty.SlidingWindow()  # 0.9 over 128 plays at high, width 4
  s = c.init(["Sorting"])
  assert s["Sorting"] == difficulty.Window(0, 0, 0, 0)
  # 115/128 = 0.898 at level 0: no promotion, the counts restart.
  s = c.update_many(s, _block("Sorting", 0, 115))
  assert s["Sorting"] == difficulty.Window(0, 0, 0, 0)
  # 116/128 = 0.906: promoted to [0, 1].
  s = c.update_many(s, _block("Sorting", 0, 116))
  assert (s["Sorting"].low, s["Sorting"].high) == (0, 1)
  # Plays below high are not counted.
  s = c.update_many(s, _block("Sorting", 0, 128, n=500))
  assert s["Sorting"] == difficulty.Window(0, 1, 0, 0)
  # Partial counts at high: 127 plays, all won, then a loss on the 128th.
  s = c.update_many(s, _block("Sorting", 1, 127, n=127))
  assert s["Sorting"] == difficulty.Window(0, 1, 127, 127)
  s = c.update(s, "Sorting", 1, 0.0)  # 127/128 >= 0.9: promoted
  assert s["Sorting"] == difficulty.Window(0, 2, 0, 0)
  # Three more promotions: the window keeps 4 levels, [1, 4] ... [2, 5].
  for level in (2, 3, 4):
    s = c.update_many(s, _block("Sorting", level, 128))
  assert (s["Sorting"].low, s["Sorting"].high) == (2, 5)
  m = difficulty.metrics(s)
  assert m["difficulty/Sorting"] == 5.0 and m["difficulty/avg_low"] == 2.0


def test_cap_and_draws():
  c = difficulty.SlidingWindow(tau_num=2, max_level=3)
  s = c.init(["A", "B"])
  for level in range(6):
    s = c.update_many(s, [("A", min(level, 3), 1.0)] * 2)
  assert (s["A"].low, s["A"].high) == (0, 3)  # capped at max_level
  assert s["B"] == difficulty.Window(0, 0)
  draws = {c.sample(s, "A", key) for key in range(200)}
  assert draws == {0, 1, 2, 3}
  assert c.sample(s, "A", 7) == c.sample(s, "A", 7)  # counter-based
  assert {c.sample(s, "B", k) for k in range(20)} == {0}


def test_state_survives_json():
  c = difficulty.SlidingWindow(tau_num=4)
  s = c.update_many(c.init(["X"]), [("X", 0, 1.0)] * 4 + [("X", 1, 1.0)])
  again = difficulty.load_state(
      json.loads(json.dumps(difficulty.state_dict(s)))
  )
  assert again == s and again["X"] == difficulty.Window(0, 1, 1, 1)


def test_bad_constants_are_refused():
  with pytest.raises(ValueError, match="tau_num"):
    difficulty.SlidingWindow(tau_num=0)
