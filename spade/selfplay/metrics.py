"""Metrics: `WORKDIR/metrics.jsonl` and TensorBoard, written by process 0.

`iteration_metrics` builds an iteration's row from its records, in one place.

Every line of metrics.jsonl is one JSON object with `step` and flat
`section/name` keys, the format big_vision keeps beside `config.json`.
TensorBoard event files go to `WORKDIR/tb` through tensorboardX (clu's writers
would pull TensorFlow in).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from spade.selfplay import records

METRICS_FILE = "metrics.jsonl"


def read_metrics(workdir: str) -> list[dict]:
  """Returns every metrics row of a workdir, oldest first."""
  path = os.path.join(workdir, METRICS_FILE)
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


class MetricWriter:
  """Appends metric rows; a no-op on every process but 0."""

  def __init__(self, workdir: str, *, tensorboard: bool = True):
    self._active = jax.process_index() == 0
    self._path = os.path.join(workdir, METRICS_FILE)
    self._tb = None
    if self._active:
      os.makedirs(workdir, exist_ok=True)
      if tensorboard:
        from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top

        self._tb = SummaryWriter(os.path.join(workdir, "tb"))

  def drop_after(self, step: int) -> None:
    """Forgets rows past `step`: a resumed run redoes those iterations."""
    if not self._active or not os.path.exists(self._path):
      return
    rows = [
        r
        for r in read_metrics(os.path.dirname(self._path))
        if r["step"] <= step
    ]
    with open(self._path + ".tmp", "w") as f:
      for row in rows:
        f.write(json.dumps(row) + "\n")
    os.replace(self._path + ".tmp", self._path)

  def write(self, step: int, metrics: Mapping[str, float]) -> None:
    """Writes one row; non-finite values are kept as null in the JSONL."""
    if not self._active:
      return
    row = {"step": int(step)}
    for key, value in sorted(metrics.items()):
      value = float(value)
      row[key] = value if math.isfinite(value) else None
      if self._tb is not None and math.isfinite(value):
        self._tb.add_scalar(key, value, step)
    with open(self._path, "a") as f:
      f.write(json.dumps(row) + "\n")
    if self._tb is not None:
      self._tb.flush()

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def iteration_metrics(
    *,
    designs: Sequence[records.Design],
    window: records.Window,
    episodes: Sequence[records.Episode],
    scores: records.Scores,
    stats: Any,
    closes: bool,
    rows: tuple[int, int, int, int],
    timings: records.Timings,
    seconds: float,
    prefill: tuple[int, int, int],
    extra: Mapping[str, float],
) -> dict[str, float]:
  """One iteration's metrics.jsonl row (without `step`).

  Args:
    designs: the designs made this iteration (none between regenerations).
    window: the regeneration window, with this iteration's plays added (its
      environments are the ones played).
    episodes: this iteration's episodes.
    scores: the iteration's `Scores`: `now` of this iteration's plays;
      regret and designer rewards over every play of the window.
    stats: the rollout's `RolloutStats`.
    closes: whether the window closed (designer rows made).
    rows: (agent rows updated on, designer rows updated on, rows made this
      iteration with signal, rows made in all).
    timings: the phases' summed `Timings`.
    seconds: the iteration's wall time.
    prefill: (prompt tokens, saved, carried) the sampler counted.
    extra: the phases' own metrics (design, update, memory), merged last.
  """
  agent_rows, designer_rows, signal, total = rows
  reasons: dict[str, int] = {}
  for d in designs:
    if not d.valid:
      reasons[d.verdict.reason] = reasons.get(d.verdict.reason, 0) + 1
  lengths = [len(ep.turns) for ep in episodes] or [0]
  envs = window.envs
  summary = scores.summary
  out = {
      "designer/num_designs": float(len(designs)),
      "designer/valid_rate": (
          float(np.mean([d.valid for d in designs])) if designs else 0.0
      ),
      "designer/reward_mean": (
          float(scores.design_reward.mean()) if window.designs else 0.0
      ),
      "designer/window_closed": float(closes),
      "regret/mean": summary["regret_mean"],
      "agent/return_hint": summary["return_hint"],
      "agent/return_nohint": scores.now["return_nohint"],
      "agent/window_return_nohint": summary["return_nohint"],
      "agent/hint_gap": summary["return_hint"] - summary["return_nohint"],
      "agent/hinted_arm": float(any(ep.hinted for ep in episodes)),
      "agent/episodes": float(len(episodes)),
      "agent/episode_length_mean": float(np.mean(lengths)),
      "agent/episode_length_max": float(np.max(lengths)),
      "agent/episode_errors": float(
          sum(ep.error is not None for ep in episodes)
      ),
      "agent/env_failed_episodes": float(sum(ep.env_failed for ep in episodes)),
      # Unhinted plays played again after their environment failed, and
      # those left out of their group, failed after any retry.
      "agent/retried_plays": float(stats.retried_plays),
      "agent/dropped_plays": float(stats.dropped_plays),
      "agent/tool_calls": float(stats.tool_calls),
      "agent/malformed_tool_calls": float(stats.malformed_tool_calls),
      "agent/num_envs": float(len(envs)),
      "agent/seed_envs": float(sum(e.origin in ("seed", "pool") for e in envs)),
      "train/rows_with_signal": float(signal),
      "train/rows_total": float(total),
      "update/agent_rows": float(agent_rows),
      "update/designer_rows": float(designer_rows),
      "tokens/sampled": float(
          stats.tokens_sampled + sum(len(d.completion_ids) for d in designs)
      ),
      # Prompt tokens the slot servers took in (every prompt whole, no
      # padding), those taken from a cache instead of prefilled (an
      # episode's own history or another slot's shared prefix), and of
      # those the history carried from an episode's last turn
      # (`slot_server.PromptCounts`, `Engine.prefill_counts`).
      "tokens/prefill": float(prefill[0]),
      "tokens/prefill_saved": float(prefill[1]),
      "tokens/carried": float(prefill[2]),
      # The agent rollout's decode row-steps (slots x steps, or lock-step
      # rows x their call's longest reply), tokens, and their ratio.
      "rollout/decode_row_steps": float(stats.decode_row_steps),
      "rollout/tokens_generated": float(stats.tokens_generated),
      "rollout/padding_ratio": float(stats.padding_ratio),
      "time/sampling_s": timings.sampling,
      "time/sandbox_s": timings.sandbox,
      "time/rollout_sandbox_s": stats.sandbox_s,
      "time/sandbox_hidden_s": stats.sandbox_hidden_s,
      "time/update_s": timings.update,
      "time/iteration_s": seconds,
  }
  out.update({f"designer/invalid/{r}": float(n) for r, n in reasons.items()})
  out.update(extra)
  return out
