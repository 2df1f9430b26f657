"""Turns sampled designs and played episodes into the update's padded batch.

A training row is one sampled completion and the prompt it was sampled from:
`tokens = prompt + completion`, `loss_mask` True on the completion only (the
model is trained on what it sampled, never on prompts or environment text),
`old_logprobs` the sampler's logprobs at those positions, one scalar
advantage per row. An agent row is one turn of an episode, carrying its
episode's advantage; a designer row is one program.

Rows are right-padded to a power-of-two length bucket and the row count to a
multiple of `row_multiple` (the mesh's batch-axis size) with zero-weight rows,
so the jitted update compiles for a handful of shapes only.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass
class Row:
  """One sampled completion with its prompt and advantage."""

  prompt_ids: list[int]
  completion_ids: list[int]
  logprobs: list[float]
  advantage: float


def _bucket(n: int, minimum: int = 64, step: int = 256) -> int:
  """Powers of two up to `step`, then multiples of `step`.

  Few shapes to compile, and a 770-token row pads to 1024, not 2048 (the
  update's activation memory grows with the square of the length).
  """
  size = minimum
  while size < n and size < step:
    size *= 2
  if size >= n:
    return size
  return -(-n // step) * step


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
    rows: the rows; a row longer than `max_len` keeps its whole completion
      and the end of its prompt (the completion is what is trained).
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
    completion = list(r.completion_ids)[:max_len]
    logprobs = list(r.logprobs)[: len(completion)]
    room = max_len - len(completion)
    prompt = list(r.prompt_ids)[-room:] if room > 0 else []
    clipped.append((prompt, completion, logprobs, r.advantage))
  length = _bucket(max((len(p) + len(c) for p, c, _, _ in clipped), default=1))
  length = min(length, max_len)
  # Rows too go to a power of two (then a multiple of the batch shards): the
  # number of turns played changes every iteration, the compiled shapes
  # should not.
  n = _bucket(max(len(clipped), min_rows or 0, 1), minimum=1, step=1 << 30)
  n = -(-n // row_multiple) * row_multiple
  tokens = np.full((n, length), pad_id, np.int32)
  positions = np.zeros((n, length), np.int32)
  input_mask = np.zeros((n, length), bool)
  loss_mask = np.zeros((n, length), bool)
  old_logprobs = np.zeros((n, length), np.float32)
  advantages = np.zeros((n,), np.float32)
  weights = np.zeros((n,), np.float32)
  for i, (prompt, completion, logprobs, advantage) in enumerate(clipped):
    seq = prompt + completion
    tokens[i, : len(seq)] = seq
    positions[i, : len(seq)] = np.arange(len(seq))
    input_mask[i, : len(seq)] = True
    # Position t predicts token t+1: the completion's tokens are targets at
    # their own positions, and the loss code shifts logits by one.
    start = len(prompt)
    loss_mask[i, start : start + len(completion)] = True
    old_logprobs[i, start : start + len(logprobs)] = logprobs
    advantages[i] = advantage
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
