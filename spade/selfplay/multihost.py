"""Host-side exchange between processes of a multi-host run.

The device work is one SPMD program over the global mesh; the host-side work
(sandbox results, verdicts, documents) is sliced across processes and
exchanged here so that every process holds the same programs, histories and
archive.

The exchange goes through the key-value store of JAX's own coordination
service (the one `jax.distributed.initialize` starts), not through a device
collective: the rollout steps environments in a worker thread while
the main thread runs the sampler's collectives, and two threads issuing
device collectives in different orders on different processes deadlock. Each
call site passes a `tag`; calls with the same tag are matched in order, so
every process must make them in the same order (they do: the loop is the same
program on every process).
"""

from __future__ import annotations

import collections
import json
import threading
from typing import Any

import jax

from spade.model import sharding

# Generous: a peer may be busy sampling or stepping a slow environment.
_TIMEOUT_MS = 60 * 60 * 1000

_counters: collections.Counter = collections.Counter()
_lock = threading.Lock()


def _client():
  from jax._src import distributed  # pylint: disable=g-import-not-at-top

  client = distributed.global_state.client
  if client is None:
    raise RuntimeError(
        "several JAX processes but no distributed client: call"
        " jax.distributed.initialize() first (spade.main does with"
        " --coordinator_address/--num_processes/--process_id)"
    )
  return client


def allgather_objects(obj: Any, tag: str = "default") -> list[Any]:
  """Returns every process's JSON-able `obj`, in process order.

  One process: `[obj]` without any communication.
  """
  count = jax.process_count()
  if count == 1:
    return [obj]
  with _lock:
    n = _counters[tag]
    _counters[tag] += 1
  client = _client()
  me = jax.process_index()
  prefix = f"spade/{tag}/{n}"
  client.key_value_set(f"{prefix}/{me}", json.dumps(obj))
  out = [
      json.loads(client.blocking_key_value_get(f"{prefix}/{p}", _TIMEOUT_MS))
      for p in range(count)
  ]
  # Every process wrote round n only after it had read all of round n - 1
  # (one tag's calls are sequential on each process), so round n - 1 has
  # been read by all: each process deletes its own key of it. The store
  # holds at most the latest round of each tag, not the whole run.
  if n > 0:
    client.key_value_delete(f"spade/{tag}/{n - 1}/{me}")
  return out


def slice_for_process(n: int) -> range:
  """Indices 0..n-1 this process executes (`sharding.process_slice`)."""
  return sharding.process_slice(n, jax.process_index(), jax.process_count())
