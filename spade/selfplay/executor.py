"""The environment executor: validates programs and runs their episodes.

The loop's other service beside the policy (`spade.selfplay.engine`): it
owns the sandbox pool and nothing of the model. Every process validates and
steps its own slice of the programs and episodes in its host's pool; results
are exchanged so that every process holds all of them (`multihost`).
"""

from __future__ import annotations

import functools

import jax
import ml_collections

from spade.agent import rollout
from spade.environments import sandboxes
from spade.environments import validator as validator_lib
from spade.sandbox import pool as pool_lib
from spade.selfplay import multihost
from spade.selfplay import records


class Executor:
  """Validation and environment calls for one run, over one sandbox pool."""

  def __init__(self, config: ml_collections.ConfigDict):
    self.config = config
    self._pool = None

  @property
  def pool(self) -> pool_lib.SandboxPool:
    """The sandbox pool, started on first use (sandboxes take seconds)."""
    if self._pool is None:
      self._pool = sandboxes.from_config(self.config.sandbox)
    return self._pool

  def validate(self, codes: list[str]) -> list[records.Verdict]:
    """Verdicts for every program; each process validates its own slice."""
    mine = list(multihost.slice_for_process(len(codes)))
    # sandbox.call_timeout_s and environments.require, read by the validator.
    options = validator_lib.options_from_config(self.config)
    sources = [codes[i] for i in mine]
    verdicts = self.pool.validate(sources, **options) if mine else []
    merged: dict[int, dict] = {}
    for part in multihost.allgather_objects(
        list(zip(mine, verdicts)), tag="validate"
    ):
      merged.update({int(i): v for i, v in part})
    return [records.Verdict.from_dict(merged[i]) for i in range(len(codes))]

  def episodes(self) -> rollout.PoolExecutor:
    """The rollout's `StepExecutor` over this pool."""
    return rollout.PoolExecutor(
        self.pool,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        allgather=functools.partial(multihost.allgather_objects, tag="rollout"),
    )

  def close(self) -> None:
    if self._pool is not None:
      self._pool.close()
      self._pool = None
