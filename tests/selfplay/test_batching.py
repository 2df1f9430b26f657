"""Padded update batches: masks on sampled tokens only, buckets, padding rows."""

import numpy as np
import pytest

from spade.selfplay import batching


def test_rows_are_padded_and_masked():
  rows = [
      batching.Row([1, 2, 3], [4, 5], [-0.1, -0.2], 1.5),
      batching.Row([7], [8, 9, 10], [-1.0, -2.0, -3.0], -0.5),
  ]
  b = batching.make_batch(rows, max_len=64, pad_id=0, row_multiple=4)
  assert b["tokens"].shape == (4, 64)
  np.testing.assert_array_equal(b["tokens"][0, :6], [1, 2, 3, 4, 5, 0])
  np.testing.assert_array_equal(
      b["loss_mask"][0, :6], [False, False, False, True, True, False]
  )
  np.testing.assert_allclose(b["old_logprobs"][1, 1:4], [-1.0, -2.0, -3.0])
  np.testing.assert_array_equal(b["input_mask"][1, :5], [1, 1, 1, 1, 0])
  np.testing.assert_array_equal(b["weights"], [1, 1, 0, 0])
  np.testing.assert_allclose(b["advantages"], [1.5, -0.5, 0, 0])
  assert not b["loss_mask"][2:].any()


def test_a_row_longer_than_max_len_is_an_error_never_cut():
  # Cutting would score the completion in a context it was not sampled in.
  rows = [batching.Row(list(range(100)), [500, 501], [-1.0, -1.0], 1.0)]
  with pytest.raises(ValueError, match="exceeds model.max_len=32"):
    batching.make_batch(rows, max_len=32, pad_id=0)
  rows = [batching.Row(list(range(20)), [500, 501], [-1.0, -1.0], 1.0)] * 5
  b = batching.make_batch(rows, max_len=32, pad_id=0)
  assert b["tokens"].shape == (8, 32)  # 5 rows -> 8, the next power of two
  np.testing.assert_array_equal(b["tokens"][0, 19:22], [19, 500, 501])
  assert b["loss_mask"][0].sum() == 2


def test_an_episode_row_masks_what_the_environment_said():
  row = batching.Row(
      [1, 2],
      [10, 11, 7, 7, 12],
      [-0.1, -0.2, 0.0, 0.0, -0.3],
      1.0,
      mask=[True, True, False, False, True],
  )
  b = batching.make_batch([row], max_len=64, pad_id=0)
  np.testing.assert_array_equal(b["loss_mask"][0, :8], [0, 0, 1, 1, 0, 0, 1, 0])
  np.testing.assert_allclose(
      b["old_logprobs"][0, :7], [0, 0, -0.1, -0.2, 0, 0, -0.3]
  )


def test_empty_role_still_has_rows():
  b = batching.make_batch([], max_len=32, pad_id=0, row_multiple=2, min_rows=2)
  assert b["tokens"].shape[0] == 2 and b["weights"].sum() == 0


# The batch of `optim.global_batch_size` samples (`batching.shape_batch`),
# against the reference's list built sample by sample.


def _reference_batch(designer, agent, size):
  """The reference's batch as a list of (sample, is_pad), materialised:
  designer samples first, the agent's upsampled round-robin
  (`trajectory_build.upsample_trajectories`, spade/core/orchestrator.py
  stage 7), inert-padded when short and trimmed from the end
  (spade/slime/spade_rollout.py)."""
  actor = list(agent)
  wanted = size - len(designer)
  i = 0
  while agent and len(actor) < wanted:
    actor.append(agent[i % len(agent)])
    i += 1
  batch = [(s, False) for s in list(designer) + actor]
  if 0 < len(batch) < size:
    n = len(batch)
    batch += [(batch[j % n][0], True) for j in range(size - n)]
  return batch[:size]


def _reference_weights(designer, agent, size):
  """Each sample's summed weight in the reference's loss: slime divides the
  sum of sample means by the global batch, and real samples' rewards are
  scaled by global batch / real ones when the batch is short."""
  batch = _reference_batch(designer, agent, size)
  real = sum(not pad for _, pad in batch)
  scale = size / real if 0 < real < size else 1.0
  out = {s: 0.0 for s in list(designer) + list(agent)}
  for s, pad in batch:
    out[s] += 0.0 if pad else scale / size
  return out


def test_trimming_keeps_the_designer_and_drops_agent_samples_from_the_end():
  shape = batching.shape_batch(3, 5, 6)
  assert shape.designer == (1, 1, 1)
  assert shape.agent == (1, 1, 1, 0, 0)
  assert (shape.trimmed, shape.duplicated, shape.real) == (2, 0, 6)
  # More designs than the batch: the designer's tail goes too, every agent
  # sample with it.
  shape = batching.shape_batch(5, 2, 4)
  assert shape.designer == (1, 1, 1, 1, 0) and shape.agent == (0, 0)
  assert shape.trimmed == 3


def test_agent_samples_are_duplicated_round_robin_to_fill_the_batch():
  # 10 - 2 designs = 8 agent samples: the 3 originals, then copies of the
  # first, second, third, first, second.
  shape = batching.shape_batch(2, 3, 10)
  assert shape.designer == (1, 1)
  assert shape.agent == (3, 3, 2)
  assert (shape.trimmed, shape.duplicated, shape.real) == (0, 5, 10)
  assert batching.shape_batch(0, 4, 8).agent == (2, 2, 2, 2)


def test_a_short_batch_divides_by_its_real_samples():
  # No agent sample to duplicate: 3 designs in a batch of 192 are padded
  # with loss-free copies, and the loss divides by the 3.
  shape = batching.shape_batch(3, 0, 192)
  assert shape.designer == (1, 1, 1) and shape.real == 3
  w = _reference_weights(["d0", "d1", "d2"], [], 192)
  assert w == pytest.approx({"d0": 1 / 3, "d1": 1 / 3, "d2": 1 / 3})


@pytest.mark.parametrize(
    "num_designer, num_agent, size",
    [
        (2, 3, 10),  # upsampled, uneven copies
        (24, 168, 192),  # the reference's regeneration step: exactly full
        (24, 192, 192),  # 24 agent samples trimmed
        (0, 192, 192),
        (0, 5, 192),
        (5, 0, 192),  # short: divided by the real samples
        (7, 2, 4),  # designs alone overflow the batch
        (0, 0, 8),
    ],
)
def test_copy_counts_weigh_as_the_references_materialised_batch(
    num_designer, num_agent, size
):
  designer = [f"d{i}" for i in range(num_designer)]
  agent = [f"a{i}" for i in range(num_agent)]
  want = _reference_weights(designer, agent, size)
  shape = batching.shape_batch(num_designer, num_agent, size)
  copies = shape.designer + shape.agent
  got = {s: c / max(shape.real, 1) for s, c in zip(designer + agent, copies)}
  assert got == pytest.approx(want)
  batch = _reference_batch(designer, agent, size)
  assert shape.trimmed == sum(
      s not in {t for t, _ in batch} for s in designer + agent
  )
  assert shape.duplicated == max(
      0, sum(not pad for _, pad in batch) - len(set(t for t, _ in batch))
  )


def _config(size):
  from spade import config as config_lib  # pylint: disable=g-import-not-at-top

  c = config_lib.base_config()
  c.optim.global_batch_size = size
  return c


def _row(tag, advantage=1.0):
  """A row told apart by its one prompt token."""
  return batching.Row([tag], [2, 3], [-0.5, -0.5], advantage)


def _weights_by_prompt(agent_rows, designer_rows, samples):
  """Each batched row's weight in the loss, by its one prompt token: the
  update's batch (`make_batch`, `update.sample_weights`)."""
  from spade.train import update  # pylint: disable=g-import-not-at-top

  batch = {
      "agent": batching.make_batch(agent_rows, max_len=16, pad_id=0),
      "designer": batching.make_batch(designer_rows, max_len=16, pad_id=0),
  }
  batch = update.sample_weights(batch, samples)
  out = {}
  for role, rows in (("agent", agent_rows), ("designer", designer_rows)):
    for i, r in enumerate(rows):
      out[r.prompt_ids[0]] = float(batch[role]["weights"][i])
  return out


def test_update_rows_weigh_each_batched_row_as_the_reference():
  from spade.selfplay import score  # pylint: disable=g-import-not-at-top

  # Designs 10, 11 (no signal), 12; episodes 20 (one row), 21 (no signal),
  # 22 (two turn rows), 23.
  designer = [_row(10), None, _row(12)]
  agent = [[_row(20)], [], [_row(22), _row(32)], [_row(23)]]
  size = 12
  agent_rows, designer_rows, samples, metrics = score.update_rows(
      _config(size), agent, designer, total=99
  )
  # 12 - 3 designs = 9 agent samples from 4: copies 3, 2, 2, 2.
  assert [r.copies for r in agent_rows] == [3, 2, 2, 2]
  assert [r.copies for r in designer_rows] == [1, 1]
  assert samples == 12
  assert metrics == {
      "update/trimmed_samples": 0.0,
      "update/duplicated_samples": 5.0,
      "update/real_samples": 12.0,
  }
  want = _reference_weights(["d0", "d1", "d2"], ["a0", "a1", "a2", "a3"], 12)
  # A turn row of an episode weighs as its episode.
  sample_of = {10: "d0", 12: "d2", 20: "a0", 22: "a2", 32: "a2", 23: "a3"}
  got = _weights_by_prompt(agent_rows, designer_rows, samples)
  assert got == pytest.approx({t: want[s] for t, s in sample_of.items()})

  # Trimmed: the batch of 5 keeps the 3 designs and the first 2 episodes;
  # episode 21 carries no row, so 20 alone is batched.
  agent_rows, designer_rows, samples, metrics = score.update_rows(
      _config(5), agent, designer, total=99
  )
  assert [r.prompt_ids[0] for r in agent_rows] == [20]
  assert [r.prompt_ids[0] for r in designer_rows] == [10, 12]
  assert samples == 5 and metrics["update/trimmed_samples"] == 2.0


def test_no_global_batch_keeps_every_row_once_over_the_rows_there_were():
  from spade.selfplay import score  # pylint: disable=g-import-not-at-top

  designer = [_row(10), None]
  agent = [[_row(20)], [], [_row(22), _row(32)]]
  agent_rows, designer_rows, samples, metrics = score.update_rows(
      _config(0), agent, designer, total=7
  )
  assert [r.prompt_ids[0] for r in agent_rows] == [20, 22, 32]
  assert [r.prompt_ids[0] for r in designer_rows] == [10]
  assert all(r.copies == 1 for r in agent_rows + designer_rows)
  assert samples == 7 and metrics["update/duplicated_samples"] == 0.0
  got = _weights_by_prompt(agent_rows, designer_rows, samples)
  assert got == pytest.approx({10: 1 / 7, 20: 1 / 7, 22: 1 / 7, 32: 1 / 7})
  # "token_mean" ignores the batch size (validation refuses the pair).
  c = _config(12)
  c.optim.loss_reduction = "token_mean"
  agent_rows, _, samples, _ = score.update_rows(c, agent, designer, total=7)
  assert samples == 7 and all(r.copies == 1 for r in agent_rows)


def test_a_rows_copies_are_its_weight_in_the_batch():
  rows = [batching.Row([1], [2], [-0.1], 1.0, copies=3), _row(4)]
  b = batching.make_batch(rows, max_len=8, pad_id=0, row_multiple=4)
  np.testing.assert_array_equal(b["weights"], [3, 1, 0, 0])
  with pytest.raises(ValueError, match="2 samples but 1 copy counts"):
    batching.with_copies([[rows[0]], []], [1])
