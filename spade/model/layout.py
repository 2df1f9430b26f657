"""The two parameter layouts: one subtree per layer, and the scanned stacks.

Loaders build one subtree per layer (`layer_0`, `layer_1`, ...) and end with
`to_model_layout`, which stacks them the way `spade.model.transformer` scans
them (layer g * P + j is index g of `layers/block_j`, the rest of the layers
`tail/block_j`); `to_per_layer_layout` undoes it, for the decoding layout.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from spade.model import architecture

Params = Mapping[str, Any]


def _stack_leaves(*leaves):
  if all(isinstance(x, np.ndarray) for x in leaves):
    return np.stack(leaves)  # host arrays stay on the host
  return jnp.stack(leaves)


def to_model_layout(params: Params, model_config) -> dict[str, Any]:
  """Turns a per-layer parameter tree into the model's own (stacked) layout.

  Loaders build the tree with one subtree per layer (`layer_0`, `layer_1`,
  ... next to `embedder`, `final_norm` and `heads`, named as in
  `spade.model.gguf_tensors`) and call this last; it returns the tree that
  `Transformer` takes: layer g * P + j becomes index g of `layers/block_j`
  (see the module docstring). numpy leaves are stacked with numpy (the result
  stays on the host), others with `jnp.stack`. A tree already in the model's
  layout (no `layer_i` keys) is returned as is.

  Raises:
    ValueError: the tree's layers are not exactly `config.model.num_layers`.
  """
  cfg = architecture.ModelConfig.from_config(model_config)
  layer_keys = {k for k in params if k.startswith("layer_")}
  if not layer_keys:
    return dict(params)
  want = {f"layer_{i}" for i in range(cfg.num_layers)}
  if layer_keys != want:
    raise ValueError(
        f"the per-layer tree has {sorted(layer_keys)}, but"
        f" config.model.num_layers={cfg.num_layers} needs layer_0 .."
        f" layer_{cfg.num_layers - 1}"
    )
  out = {k: v for k, v in params.items() if k not in layer_keys}
  for name, first, groups, size in cfg.stacks():
    out[name] = {
        f"block_{j}": jax.tree.map(
            _stack_leaves,
            *[params[f"layer_{first + g * size + j}"] for g in range(groups)],
        )
        for j in range(size)
    }
  return out


def to_per_layer_layout(params: Params, model_config) -> dict[str, Any]:
  """The inverse of `to_model_layout`: one `layer_i` subtree per layer (a
  tree already in that layout is returned as is)."""
  if is_per_layer(params):
    return dict(params)
  cfg = architecture.ModelConfig.from_config(model_config)
  out = {k: v for k, v in params.items() if k not in architecture.STACKS}
  for name, first, groups, size in cfg.stacks():
    for j in range(size):
      block = params[name][f"block_{j}"]
      for g in range(groups):
        out[f"layer_{first + g * size + j}"] = jax.tree.map(
            lambda x, g=g: x[g], block
        )
  return out


def is_per_layer(params: Params) -> bool:
  """Whether the tree is in the decoding layout (`layer_i` subtrees)."""
  return any(k.startswith("layer_") for k in params)


@jax.jit
def _take(x, g):
  return x[g]


@functools.lru_cache(maxsize=None)
def _stacker(sharding):
  return jax.jit(lambda *xs: jnp.stack(xs), out_shardings=sharding)


def owned(params: Params) -> dict[str, Any]:
  """The tree's dicts copied (its leaves shared), for `unstack_releasing`
  and `restack_releasing` to take apart."""
  return {
      k: owned(v) if isinstance(v, Mapping) else v for k, v in params.items()
  }


def unstack_releasing(params: dict[str, Any], model_config) -> dict[str, Any]:
  """`to_per_layer_layout` that takes `params` apart in place (its dicts are
  emptied: pass `owned(tree)`), letting go of each stacked leaf as soon as
  its layers are sliced out. When nothing else holds the leaves, each stack
  is freed as it is taken apart: the conversion holds one copy of the
  weights plus one stacked leaf, not two copies."""
  cfg = architecture.ModelConfig.from_config(model_config)
  out = {k: params.pop(k) for k in list(params) if k not in architecture.STACKS}
  for name, first, groups, size in cfg.stacks():
    stack = params.pop(name)
    for j in range(size):
      leaves, treedef = jax.tree.flatten(stack.pop(f"block_{j}"))
      per = [[None] * len(leaves) for _ in range(groups)]
      for i in range(len(leaves)):
        x, leaves[i] = leaves[i], None
        for g in range(groups):
          per[g][i] = _take(x, g)
        for g in range(groups):
          per[g][i].block_until_ready()
        del x
      for g in range(groups):
        out[f"layer_{first + g * size + j}"] = jax.tree.unflatten(
            treedef, per[g]
        )
  return out


def restack_releasing(
    params: dict[str, Any], model_config, shardings: Params
) -> dict[str, Any]:
  """The inverse of `unstack_releasing`, taking `params` apart in place as
  it does; `shardings`: the stacked tree's shardings (each stack is placed
  as it was before it was taken apart)."""
  cfg = architecture.ModelConfig.from_config(model_config)
  out = {k: params.pop(k) for k in list(params) if not k.startswith("layer_")}
  for name, first, groups, size in cfg.stacks():
    out[name] = {}
    for j in range(size):
      names = [f"layer_{first + g * size + j}" for g in range(groups)]
      flat = [jax.tree.flatten(params.pop(n)) for n in names]
      treedef = flat[0][1]
      columns = [leaves for leaves, _ in flat]
      del flat
      where = jax.tree.leaves(shardings[name][f"block_{j}"])
      stacked = []
      for i in range(len(columns[0])):
        parts = [column[i] for column in columns]
        for column in columns:
          column[i] = None
        stacked.append(_stacker(where[i])(*parts).block_until_ready())
        del parts
      out[name][f"block_{j}"] = jax.tree.unflatten(treedef, stacked)
  return out
