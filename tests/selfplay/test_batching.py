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
