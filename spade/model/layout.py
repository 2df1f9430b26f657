"""The two parameter layouts: one subtree per layer, and the scanned stacks.

Loaders build one subtree per layer (`layer_0`, `layer_1`, ...) and end with
`to_model_layout`, which stacks them the way `spade.model.transformer` scans
them (layer g * P + j is index g of `layers/block_j`, the rest of the layers
`tail/block_j`); `to_per_layer_layout` undoes it, for the decoding layout.
"""

from __future__ import annotations

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
  """The inverse of `to_model_layout`: one `layer_i` subtree per layer."""
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
