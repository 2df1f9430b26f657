"""Turns sampled designs and played episodes into the update's padded batch.

A training row is one sampled completion and the prompt it was sampled from:
`tokens = prompt + completion`, `loss_mask` True on the completion only (the
model is trained on what it sampled, never on prompts or environment text),
`old_logprobs` the sampler's logprobs at those positions, one scalar
advantage per row. An agent row is a whole episode when its history was
never truncated (its replies unmasked, the environment's words between them
masked, so the tokens the update scores grow with the episode, not with its
square), else one turn; it carries its episode's advantage. A designer row
is one program.

Rows are right-padded to a power-of-two length bucket and the row count to a
multiple of `row_multiple` (the mesh's batch-axis size) with zero-weight rows,
so the jitted update compiles for a handful of shapes only.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from spade.sampling import shapes


@dataclasses.dataclass(frozen=True)
class Row:
  """One sampled completion with its prompt and advantage."""

  prompt_ids: tuple[int, ...]
  completion_ids: tuple[int, ...]
  logprobs: tuple[float, ...]
  advantage: float
  # None: every completion token was sampled. Otherwise True on the sampled
  # tokens of a whole episode (its replies), False on what the environment
  # said between them; `logprobs` is then aligned with `completion_ids`.
  mask: tuple[bool, ...] | None = None

  def __post_init__(self):
    # Tuples, so a row is hashable, comparable and safe to share.
    for name in ("prompt_ids", "completion_ids", "logprobs"):
      object.__setattr__(self, name, tuple(getattr(self, name)))
    if self.mask is not None:
      object.__setattr__(self, "mask", tuple(bool(m) for m in self.mask))
      if len(self.mask) != len(self.completion_ids):
        raise ValueError("Row.mask must be as long as completion_ids")


def make_batch(
    rows: list[Row],
    *,
    max_len: int,
    pad_id: int,
    row_multiple: int = 1,
    min_rows: int | None = None,
) -> dict[str, np.ndarray]:
  """Pads rows into the update's batch dict (see `spade.train.update`).

  Args:
    rows: the rows. Each is scored exactly as it was sampled: prompt plus
      completion must fit `max_len` (the sampler's prompt budget guarantees
      it), and a row that does not is an error, never cut.
    max_len: the model's maximum sequence length.
    pad_id: the tokenizer's pad id.
    row_multiple: the row count is rounded up to a multiple of this.
    min_rows: at least this many rows (zero-weight padding), so an iteration
      with no rows of a role still has a well-formed sub-batch.

  Returns:
    {"tokens", "positions", "input_mask", "loss_mask", "old_logprobs",
    "advantages", "weights"} as numpy arrays.
  """
  clipped = []
  for r in rows:
    if len(r.prompt_ids) + len(r.completion_ids) > max_len:
      raise ValueError(
          f"a row of {len(r.prompt_ids)} prompt and {len(r.completion_ids)}"
          f" completion tokens exceeds model.max_len={max_len}; prompts must"
          " come from the sampler's prompt budget (spade.agent.prompts."
          "prompt_budget), which leaves room for the completion"
      )
    clipped.append(r)
  # Few shapes to compile, and a 770-token row pads to 1024, not 2048 (the
  # update's activation memory grows with the square of the length).
  length = shapes.bucket(
      max(
          (len(r.prompt_ids) + len(r.completion_ids) for r in clipped),
          default=1,
      ),
      minimum=64,
      step=256,
  )
  length = min(length, max_len)
  # Rows too go to a power of two (then a multiple of the batch shards): the
  # number of turns played changes every iteration, the compiled shapes
  # should not.
  n = shapes.bucket(max(len(clipped), min_rows or 0, 1), minimum=1)
  n = -(-n // row_multiple) * row_multiple
  tokens = np.full((n, length), pad_id, np.int32)
  positions = np.zeros((n, length), np.int32)
  input_mask = np.zeros((n, length), bool)
  loss_mask = np.zeros((n, length), bool)
  old_logprobs = np.zeros((n, length), np.float32)
  advantages = np.zeros((n,), np.float32)
  weights = np.zeros((n,), np.float32)
  for i, r in enumerate(clipped):
    seq = list(r.prompt_ids) + list(r.completion_ids)
    tokens[i, : len(seq)] = seq
    positions[i, : len(seq)] = np.arange(len(seq))
    input_mask[i, : len(seq)] = True
    # Position t predicts token t+1: the completion's tokens are targets at
    # their own positions, and the loss code shifts logits by one.
    start = len(r.prompt_ids)
    if r.mask is None:
      loss_mask[i, start : start + len(r.completion_ids)] = True
    else:
      loss_mask[i, start : start + len(r.mask)] = r.mask
    old_logprobs[i, start : start + len(r.logprobs)] = r.logprobs
    advantages[i] = r.advantage
    weights[i] = 1.0
  return {
      "tokens": tokens,
      "positions": positions,
      "input_mask": input_mask,
      "loss_mask": loss_mask,
      "old_logprobs": old_logprobs,
      "advantages": advantages,
      "weights": weights,
  }
