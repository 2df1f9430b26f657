"""Placing a loader's host tensors on the mesh, in the model's layout.

A loader (`spade.model.hf`, `spade.model.converted_cache`) builds the
per-layer tree of `Lazy` leaves: memory-mapped views not read yet.
`materialize` turns it into the model's layout (`spade.model.layout`) with
each leaf built by `jax.make_array_from_callback`, so every device reads and
converts only its own shard and no host holds a float32 copy of more than
one tensor besides the result.
"""

from __future__ import annotations

import dataclasses
import mmap
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from spade.model import architecture
from spade.model import gguf_files
from spade.model import layers
from spade.model import layout
from spade.model import sharding as sharding_lib
from spade.model import transformer

CheckpointFileError = gguf_files.CheckpointFileError


def _shardings_for(tree, mesh, rules):
  return sharding_lib.fitted_param_shardings(tree, mesh, rules)


@dataclasses.dataclass(frozen=True)
class Lazy:
  """A tensor not read yet: a memory-mapped view in our layout."""

  view: np.ndarray
  plus_one: bool = False  # Gemma's stored norm w, the model's scale 1 + w

  def read(self, index, dtype) -> np.ndarray:
    """Converts the block `view[index]` only, into an owned copy (on CPU a
    device array may alias its numpy source, and the mapped file is
    read-only and may be replaced)."""
    out = np.empty(self.view[index].shape, dtype)
    self.read_into(index, out)
    return out

  def read_into(self, index, out: np.ndarray) -> None:
    """Converts the block `view[index]` into `out` (no other copy); Gemma's
    1 + w is formed in float32, then cast."""
    block = self.view[index]
    if self.plus_one:
      block = np.asarray(block, np.float32) + np.float32(1.0)
    np.copyto(out, block, casting="unsafe")
    release_pages(self.view)


def release_pages(view: np.ndarray) -> None:
  """Drops the mapped file pages behind `view` from this process's resident
  set (they stay in the page cache): a read of a memory-mapped checkpoint
  then costs the host the copy it makes, not that copy plus the file's
  pages, so loading peaks near one copy of the weights, not two."""
  base = view
  while base is not None and not isinstance(base, np.memmap):
    base = getattr(base, "base", None)
  mapping = getattr(base, "_mmap", None)
  if mapping is not None and hasattr(mapping, "madvise"):
    mapping.madvise(mmap.MADV_DONTNEED)


def _layout_plan(tree: dict[str, Any], model_config) -> Any:
  """For each leaf of the model's layout, the per-layer leaves it stacks.

  Runs `layout.to_model_layout` on a probe whose leaves are their own
  indices, so the loader follows whatever layout the model has (stacked or
  not) without a copy of the stacking rules.

  Returns:
    (the model-layout tree whose leaves are a leaf index (a tensor taken as
    is) or a list of them (stacked along a new leading axis, a list of one
    included), the flat per-layer leaves).
  """
  leaves, treedef = jax.tree.flatten(tree)
  probe = jax.tree.unflatten(
      treedef, [np.array([i], np.int64) for i in range(len(leaves))]
  )
  out = layout.to_model_layout(probe, model_config)

  def sources(ids):
    ids = np.asarray(ids)
    if ids.shape == (1,):
      return int(ids[0])
    if ids.ndim != 2 or ids.shape[1] != 1:
      raise ValueError(
          f"layout.to_model_layout gave a leaf of shape {ids.shape} for"
          " one-element leaves; the loader only follows stacking along a new"
          " leading axis."
      )
    return [int(i) for i in ids[:, 0]]

  return jax.tree.map(sources, out), leaves


def materialize(tree: dict[str, Any], model_config, mesh, rules):
  """Reads a tree of `Lazy` leaves into the model's layout, placed.

  Each leaf of the model's layout (a stack of layers, or one tensor) is
  built on the mesh by `jax.make_array_from_callback`: every device reads
  and converts only its own block of the memory-mapped tensors, so no host
  holds a converted copy of more than one stacked leaf (none at all with a
  mesh).
  """
  cfg = architecture.ModelConfig.from_config(model_config)
  dtype = jnp.dtype(cfg.param_dtype)
  if cfg.kernel_layout == "out_in":  # transposed views: nothing read here
    tree = layers.kernels_out_in(
        tree,
        lambda lazy, c, lead: dataclasses.replace(
            lazy, view=layers.to_out_in(lazy.view, c, lead)
        ),
    )
  plan, leaves = _layout_plan(tree, model_config)

  def shape(ids):
    if isinstance(ids, int):
      return leaves[ids].view.shape
    first = leaves[ids[0]].view.shape
    for i in ids:
      if leaves[i].view.shape != first:
        raise CheckpointFileError(
            f"layers stacked together have shapes {first} and "
            f"{leaves[i].view.shape}"
        )
    return (len(ids),) + tuple(first)

  is_plan = lambda x: isinstance(x, list)
  abstract = jax.tree.map(
      lambda ids: jax.ShapeDtypeStruct(shape(ids), dtype), plan, is_leaf=is_plan
  )

  def read(ids, index):
    if isinstance(ids, int):
      return leaves[ids].read(index, dtype)
    picked = range(len(ids))[index[0]]
    # Layer by layer into the stack itself: one copy of the stacked leaf.
    shape = leaves[ids[0]].view[index[1:]].shape  # a view: nothing read
    block = np.empty((len(picked),) + shape, dtype)
    for n, g in enumerate(picked):
      leaves[ids[g]].read_into(index[1:], block[n])
    return block

  if mesh is None:
    full = lambda ids, spec: jax.device_put(read(ids, (slice(None), ...)))
    return jax.tree.map(full, plan, abstract, is_leaf=is_plan)
  shardings = _shardings_for(abstract, mesh, rules)
  return jax.tree.map(
      lambda ids, spec, sharding: jax.make_array_from_callback(
          spec.shape, sharding, lambda index: read(ids, index)
      ),
      plan,
      abstract,
      shardings,
      is_leaf=is_plan,
  )


def set_leaf(tree: dict, keys: tuple[str, ...], value) -> None:
  """Sets `tree[k0][k1]...[kn] = value`, making the dicts on the way."""
  for key in keys[:-1]:
    tree = tree.setdefault(key, {})
  tree[keys[-1]] = value


def flat_items(tree, prefix=()):
  """Yields (path of keys, leaf) of a nested dict, depth first."""
  for key, value in tree.items():
    if isinstance(value, dict):
      yield from flat_items(value, prefix + (key,))
    else:
      yield prefix + (key,), value


def with_heads(
    tree: dict[str, Any], output: np.ndarray, model_config
) -> dict[str, Any]:
  """Adds the heads `config.model` builds (`transformer.head_names`: one
  shared, or one per role) to `tree`, each read from the output layer."""
  # One read of the view per head: separate buffers, so a donating update
  # never sees one buffer twice.
  tree["heads"] = {
      name: {"unembedding": Lazy(output)}
      for name in transformer.head_names(model_config)
  }
  return tree
