"""Metrics: `WORKDIR/metrics.jsonl` and TensorBoard, written by process 0.

Every line of metrics.jsonl is one JSON object with `step` and flat
`section/name` keys, the format big_vision keeps beside `config.json`.
TensorBoard event files go to `WORKDIR/tb` through tensorboardX (clu's writers
would pull TensorFlow in).
"""

from __future__ import annotations

import json
import math
import os
from typing import Mapping

import jax

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
