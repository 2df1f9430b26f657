"""PLR replay: the distribution matches the formula, computed by hand."""

import jax
import jax.numpy as jnp
import numpy as np

from spade.memory import replay


def _state():
  # Slots 0-2 hold environments with regrets 0.5, 0.9, 0.1; slot 3 is empty.
  s = replay.init(4)
  s = replay.insert(s, 0, 0.5, 1)
  s = replay.insert(s, 1, 0.9, 3)
  s = replay.insert(s, 2, 0.1, 0)
  return s


def test_ranks_put_highest_score_first_and_empty_slots_last():
  s = _state()
  np.testing.assert_array_equal(replay.ranks(s.scores, s.valid), [2, 1, 3, 4])


def test_probabilities_follow_the_plr_formula():
  # temperature 0.5: P_score ∝ (1/rank)**2 = [1/4, 1, 1/9] for ranks [2, 1, 3]
  # staleness at iteration 4: 4 - [1, 3, 0] = [3, 1, 4], so P_stale = [3, 1, 4]/8
  # P = 0.7 * P_score + 0.3 * P_stale
  w = np.array([1 / 4, 1.0, 1 / 9])
  expected = 0.7 * w / w.sum() + 0.3 * np.array([3, 1, 4]) / 8
  p = replay.probabilities(_state(), 4, 0.5, 0.3)
  np.testing.assert_allclose(p[:3], expected, rtol=1e-6)
  assert p[3] == 0.0
  np.testing.assert_allclose(float(p.sum()), 1.0, rtol=1e-6)


def test_temperature_one_and_no_staleness_is_inverse_rank():
  p = replay.probabilities(_state(), 4, 1.0, 0.0)
  w = np.array([1 / 2, 1.0, 1 / 3])
  np.testing.assert_allclose(p[:3], w / w.sum(), rtol=1e-6)


def test_staleness_is_uniform_when_everything_was_just_sampled():
  s = _state()
  s = s._replace(last_sampled=jnp.full((4,), 5, jnp.int32))
  p = replay.probabilities(s, 5, 1.0, 1.0)
  np.testing.assert_allclose(p, [1 / 3, 1 / 3, 1 / 3, 0.0], rtol=1e-6)


def test_sampling_frequencies_match_and_reset_staleness():
  s = _state()
  keys = jax.random.split(jax.random.key(0), 4000)
  draws = jax.vmap(lambda k: replay.sample(s, k, 1, 4, 0.5, 0.3)[1][0])(keys)
  freq = np.bincount(np.asarray(draws), minlength=4) / len(keys)
  expected = np.asarray(replay.probabilities(s, 4, 0.5, 0.3))
  np.testing.assert_allclose(freq, expected, atol=0.025)
  new, slots = replay.sample(s, jax.random.key(1), 3, 4, 0.5, 0.3)
  assert sorted(np.asarray(slots).tolist()) == [0, 1, 2]  # distinct, no empty
  np.testing.assert_array_equal(new.last_sampled, [4, 4, 4, 0])


def test_remove_and_update():
  s = replay.update(_state(), 2, 2.0, 4)
  np.testing.assert_array_equal(replay.ranks(s.scores, s.valid)[:3], [3, 2, 1])
  s = replay.remove(s, 1)
  assert not bool(s.valid[1])
  p = replay.probabilities(s, 4, 1.0, 0.0)
  assert p[1] == 0.0
