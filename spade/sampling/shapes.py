"""The one bucketing rule for compiled shapes (batch rows, prompt lengths).

Every jitted call that sees host-made batches (the sampler, the update, the
evaluation responder) rounds its sizes with `bucket`, so each compiles for a
handful of shapes only.
"""

from __future__ import annotations


def bucket(
    n: int, minimum: int = 1, step: int = 0, cap: int | None = None
) -> int:
  """The size n is padded to: powers of two from `minimum`, then multiples.

  Args:
    n: the size to hold.
    minimum: the smallest bucket (a power of two).
    step: past this size, round up to a multiple of `step` instead of the
      next power of two (0: powers of two all the way). A 770-token row
      then pads to 1024 with step 256, not 2048.
    cap: never return more than this (a prompt budget, `max_len`).

  Returns:
    The bucket size.
  """
  size = max(1, minimum)
  while size < n and (not step or size < step):
    size *= 2
  if size < n:
    size = -(-n // step) * step
  return min(size, cap) if cap is not None else size


def round_up(n: int, multiple: int) -> int:
  """n rounded up to a multiple of `multiple` (mesh batch shards)."""
  return -(-n // multiple) * multiple
