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

`shape_batch` sizes the update's batch to `optim.global_batch_size` samples
as the reference's does (designer samples first, agent samples duplicated
round-robin to fill it or trimmed from the end), by copy counts: a row
duplicated k times is batched once with weight k (`Row.copies`), a trimmed
one not at all, so no extra row is ever scored.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

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
  # The samples of the shaped batch this row stands for (`shape_batch`): an
  # agent episode the batch holds k times is one row of weight k.
  copies: int = 1

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
    "advantages", "weights"} as numpy arrays; a row's weight is its
    `copies`, a padding row's 0.
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
    weights[i] = r.copies
  return {
      "tokens": tokens,
      "positions": positions,
      "input_mask": input_mask,
      "loss_mask": loss_mask,
      "old_logprobs": old_logprobs,
      "advantages": advantages,
      "weights": weights,
  }


@dataclasses.dataclass(frozen=True)
class BatchShape:
  """How many times the update's batch holds each sample, in its order:
  the designer's samples, then the agent's (`shape_batch`)."""

  designer: tuple[int, ...]
  agent: tuple[int, ...]

  @property
  def real(self) -> int:
    """The batch's samples, copies included: the loss's divisor (the
    reference's padding copies carry no loss and its real samples' rewards
    are scaled by global batch / real, so its loss too divides by them)."""
    return sum(self.designer) + sum(self.agent)

  @property
  def trimmed(self) -> int:
    """Samples left out to keep the batch at its size."""
    return sum(c == 0 for c in self.designer + self.agent)

  @property
  def duplicated(self) -> int:
    """Copies of agent samples added to fill the batch."""
    return sum(max(c - 1, 0) for c in self.agent)


def shape_batch(
    num_designer: int, num_agent: int, global_batch_size: int
) -> BatchShape:
  """Copy counts that make the reference's batch of `global_batch_size`.

  The reference (`spade/core/orchestrator.py`, collect_trajectories stage
  7; `spade/slime/spade_rollout.py`, the batch after the delayed designer
  rows): designer samples first, then the agent's; fewer agent samples than
  the batch leaves are duplicated round-robin up to that count
  (`trajectory_build.upsample_trajectories`: the originals, then copies of
  the first, the second, ...); a longer batch is cut at its size, from the
  end; a shorter one is padded with copies that carry no loss.

  Args:
    num_designer: the designer's samples (designs), in order.
    num_agent: the agent's samples (episodes), in order.
    global_batch_size: the batch's samples; 0 leaves every sample once.

  Returns:
    Each sample's copies (0: trimmed).
  """
  designer, agent = [1] * num_designer, [1] * num_agent
  if global_batch_size <= 0:
    return BatchShape(tuple(designer), tuple(agent))
  wanted = global_batch_size - num_designer
  if 0 < num_agent < wanted:
    extra = wanted - num_agent
    agent = [
        1 + extra // num_agent + (i < extra % num_agent)
        for i in range(num_agent)
    ]
  # Upsampling fills the batch exactly, so only unduplicated samples are
  # ever trimmed, and the order of the copies does not matter here.
  left, copies = global_batch_size, []
  for c in designer + agent:
    copies.append(min(c, left))
    left -= copies[-1]
  return BatchShape(tuple(copies[:num_designer]), tuple(copies[num_designer:]))


def with_copies(
    samples: Sequence[Sequence[Row]], copies: Sequence[int]
) -> list[Row]:
  """Each sample's rows with its copy count (`shape_batch`); a trimmed
  sample's rows are left out. A sample may have no rows (no signal) or
  several (an episode trained turn by turn)."""
  if len(samples) != len(copies):
    raise ValueError(f"{len(samples)} samples but {len(copies)} copy counts")
  return [
      dataclasses.replace(r, copies=k) if k != r.copies else r
      for rows, k in zip(samples, copies)
      if k
      for r in rows
  ]
