"""Whole-state checkpoints with orbax: save, resume, fall back.

A checkpoint holds two items:

  state       the train-state pytree (params, optimizer state, step, rng),
              saved by orbax collectively from every process (sharded arrays
              are written by the processes that own them);
  curriculum  a JSON document: the memory archive, the replay buffer, the
              corpus cursor, the delayed designer batches' bookkeeping.

Orbax writes a step to a temporary directory and renames it when complete, so
a `kill -9` mid-save leaves only the previous complete steps; restarting on
the same workdir resumes from the newest one. A newest step that fails to
restore (a corrupted file) is skipped with a warning and the one before it is
used.
"""

from __future__ import annotations

import os
from typing import Any

from absl import logging
import jax
import orbax.checkpoint as ocp

CHECKPOINT_DIR = "checkpoints"


class CheckpointError(RuntimeError):
  """No usable checkpoint where one was expected."""


def make_manager(workdir: str, keep: int = 3) -> ocp.CheckpointManager:
  """Returns the orbax manager for `WORKDIR/checkpoints`."""
  directory = os.path.abspath(os.path.join(workdir, CHECKPOINT_DIR))
  options = ocp.CheckpointManagerOptions(
      max_to_keep=keep, create=True, enable_async_checkpointing=False
  )
  return ocp.CheckpointManager(
      directory, options=options, item_names=("state", "curriculum")
  )


def save(
    manager: ocp.CheckpointManager,
    step: int,
    state: Any,
    curriculum: dict,
) -> None:
  """Saves the whole state at `step` (all processes must call this)."""
  manager.save(
      step,
      args=ocp.args.Composite(
          state=ocp.args.StandardSave(state),
          curriculum=ocp.args.JsonSave(curriculum),
      ),
  )
  manager.wait_until_finished()


def restore_latest(
    manager: ocp.CheckpointManager, abstract_state: Any
) -> tuple[int, Any, dict] | None:
  """Restores the newest usable step, or returns None when there is none.

  Args:
    manager: from `make_manager`.
    abstract_state: a pytree of `jax.ShapeDtypeStruct` with shardings (e.g.
      `jax.eval_shape` of the state init, with `.sharding` set) so arrays are
      restored directly onto their devices.

  Returns:
    (step, state, curriculum) or None.
  """
  steps = sorted(manager.all_steps(), reverse=True)
  for step in steps:
    try:
      restored = manager.restore(
          step,
          args=ocp.args.Composite(
              state=ocp.args.StandardRestore(abstract_state),
              curriculum=ocp.args.JsonRestore(),
          ),
      )
    except Exception as e:  # pylint: disable=broad-except
      # Any failure to read this step (truncated file, bad metadata) means
      # the step is unusable; an older complete one is better than none.
      logging.warning(
          "checkpoint step %d in %s is unreadable (%s: %s); trying the"
          " previous one",
          step,
          manager.directory,
          type(e).__name__,
          str(e).splitlines()[0] if str(e) else "",
      )
      continue
    return step, restored.state, dict(restored.curriculum)
  if steps:
    raise CheckpointError(
        f"none of the checkpoints {steps} in {manager.directory} could be"
        " restored; move the directory away to start afresh"
    )
  return None


def abstract_like(state: Any) -> Any:
  """Shape/dtype/sharding skeleton of a concrete state, for restoring."""

  def leaf(x):
    if isinstance(x, jax.Array):
      return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    return x

  return jax.tree.map(leaf, state)


def latest_params(config, workdir: str) -> Any | None:
  """The parameters of the newest usable checkpoint in `workdir`, or None.

  For evaluation and tools: restores the state item without a target (host
  arrays in their saved layout) and returns its `params`; a step that fails
  to read is skipped with a warning, as in `restore_latest`.
  """
  directory = os.path.join(workdir, CHECKPOINT_DIR)
  if not os.path.isdir(directory):
    return None
  manager = make_manager(workdir, keep=config.train.keep_checkpoints)
  for step in sorted(manager.all_steps(), reverse=True):
    try:
      restored = manager.restore(
          step, args=ocp.args.Composite(state=ocp.args.StandardRestore())
      )
    except Exception as e:  # pylint: disable=broad-except
      logging.warning(
          "checkpoint step %d in %s is unreadable (%s); trying the previous"
          " one",
          step,
          directory,
          type(e).__name__,
      )
      continue
    state = restored.state
    return state["params"] if isinstance(state, dict) else state.params
  return None
