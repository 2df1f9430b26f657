"""Host-side exchange between processes of a multi-host run.

The device work is one SPMD program over the global mesh; the host-side work
(sandbox results, verdicts) is sliced across processes and exchanged here so
that every process holds the same programs, histories and archive.
"""

from __future__ import annotations

import json
from typing import Any

import jax
from jax.experimental import multihost_utils
import numpy as np


def allgather_objects(obj: Any) -> list[Any]:
  """Returns every process's JSON-able `obj`, in process order.

  One process: `[obj]` without any collective.
  """
  if jax.process_count() == 1:
    return [obj]
  data = np.frombuffer(json.dumps(obj).encode(), np.uint8)
  sizes = multihost_utils.process_allgather(np.array([data.size], np.int64))
  sizes = np.asarray(sizes).reshape(-1)
  padded = np.zeros((int(sizes.max()),), np.uint8)
  padded[: data.size] = data
  gathered = np.asarray(multihost_utils.process_allgather(padded))
  gathered = gathered.reshape(len(sizes), -1)
  return [
      json.loads(bytes(gathered[i, : sizes[i]]).decode())
      for i in range(len(sizes))
  ]


def slice_for_process(n: int) -> range:
  """Indices 0..n-1 this process executes (round-robin)."""
  return range(jax.process_index(), n, jax.process_count())
