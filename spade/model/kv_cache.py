"""The KV cache: its shape, an empty one, and writing new keys and values.

`init_cache` makes a cache stacked like the parameters: per block the keys
and values (RoPE already applied) and the position of each slot (-1 =
empty), with the leading layer axis; or, for the decoding layout, one entry
per layer. A global layer's cache holds the whole sequence; a sliding-window
layer's cache is a ring buffer of `min(window, length)` slots, slot = time %
size. `write` puts a step's keys and values in place; `layer_view` reads one
layer of a stacked cache. With `config.model.kv_cache_dtype="int8"` the keys
and values are int8 beside their scales ("k_scale", "v_scale": `quantize`).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from spade.model import architecture
from spade.model import mesh_fit

Array = jax.Array
# {stack: {block: {"k", "v", "pos": array}}}, or {layer: {...}} per layer.
Cache = dict[str, dict[str, dict[str, Array]]]

# Logical names of the KV cache entries.
# k and v are [layers, batch, kv_heads, slots, head_dim]; pos is [layers,
# batch, slots]. The rows go over the batch axes and the KV heads over
# "cache_heads" (the tensor axis, as the query heads are), so a chip holds
# and reads only its own heads of its own rows.
CACHE_AXES = {
    "k": ("layers", "batch", "cache_heads", "length", "head_dim"),
    "v": ("layers", "batch", "cache_heads", "length", "head_dim"),
    "pos": ("layers", "batch", "length"),
    # int8 caches: [layers, batch, kv_heads, slots], float32.
    "k_scale": ("layers", "batch", "cache_heads", "length"),
    "v_scale": ("layers", "batch", "cache_heads", "length"),
}


def slot_axis(name: str, stacked: bool = True) -> int:
  """The axis of cache leaf `name` that holds the time slots."""
  return CACHE_AXES[name].index("length") - (0 if stacked else 1)


def fitted_axes(shape, axes) -> tuple[str | None, ...]:
  """`axes` (logical names) with each name dropped whose mesh axes, under
  the mesh and rules the trace runs under, do not divide its dimension
  (e.g. one KV head over tensor=2): that dimension stays whole."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return tuple(axes)
  spec = nn.logical_to_mesh_axes(tuple(axes), nn.get_logical_axis_rules())
  ok = mesh_fit.divides(mesh, shape, spec)
  return tuple(name if fits else None for name, fits in zip(axes, ok))


def quantize(x: Array) -> tuple[Array, Array]:
  """x [..., head_dim] as int8 and a float32 scale per vector [...]:
  x ~ q * scale, symmetric, scale = max |x| / 127 (round to nearest, so
  each entry is off by at most scale / 2). A vector of zeros has scale 0."""
  x32 = x.astype(jnp.float32)
  scale = jnp.max(jnp.abs(x32), axis=-1) / 127.0
  safe = jnp.where(scale > 0, scale, 1.0)
  q = jnp.clip(jnp.round(x32 / safe[..., None]), -127, 127)
  return q.astype(jnp.int8), scale


def _entries(cache: dict[str, Array], k, v, pos) -> dict[str, Array]:
  """What a write puts in `cache`'s leaves: the keys and values as they
  are, or, in an int8 cache (one with scales), quantized."""
  if "k_scale" not in cache:
    return {"k": k, "v": v, "pos": pos}
  k, k_scale = quantize(k)
  v, v_scale = quantize(v)
  return {"k": k, "v": v, "pos": pos, "k_scale": k_scale, "v_scale": v_scale}


def _constrain(x: Array, *axes: str | None) -> Array:
  return nn.with_logical_constraint(x, fitted_axes(x.shape, axes))


def row_shards(name: str = "batch") -> int:
  """How many shards the cache's rows (or those of logical axis `name`)
  are split into under the mesh and rules the trace runs under (the
  product of its mesh axes; 1 with no mesh)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return 1
  return mesh_fit.split_ways(mesh, mesh_fit.mesh_axes(name))


def _by_shard(x: Array, axis: int, shards: int, name: str | None) -> Array:
  """x with its row axis `axis` as [shards, rows a shard] (a view: each
  shard's rows stay where they are), constrained so when `name` is a
  cache leaf's."""
  r = x.shape[axis]
  x = x.reshape(x.shape[:axis] + (shards, r // shards) + x.shape[axis + 1 :])
  if name is None:
    return x
  axes = list(CACHE_AXES[name][-(x.ndim - 1) :])
  axes.insert(axes.index("batch") + 1, None)
  return _constrain(x, *axes)


def row_prefix(layer: dict[str, Array], rows: int) -> dict[str, Array]:
  """The first `rows / row_shards()` rows of each shard of a layer's cache
  ({"k", "v", ...}: [R, ...]), `rows` in all, in place: a one-token step
  on a gathered prefix of the rows reads only theirs, with no copy (XLA
  fuses the slice into the attention matmuls' operands)."""
  out = {}
  for name, x in layer.items():
    axis = CACHE_AXES[name].index("batch") - (len(CACHE_AXES[name]) - x.ndim)
    if x.shape[axis] == rows:
      out[name] = x
      continue
    shards = row_shards()
    view = _by_shard(x, axis, shards, name)
    view = jax.lax.slice_in_dim(view, 0, rows // shards, axis=axis + 1)
    out[name] = view.reshape(x.shape[:axis] + (rows,) + x.shape[axis + 1 :])
  return out


def _put_rows(x: Array, new: Array, axis: int, at: tuple, name: str):
  """`dynamic_update_slice(x, new, at)`, where `new` may hold fewer rows
  (axis `axis`) than x: then its rows are each shard's first (`row_prefix`)."""
  if new.shape[axis] == x.shape[axis]:
    return jax.lax.dynamic_update_slice(x, new, at)
  shards = row_shards()
  view = _by_shard(x, axis, shards, name)
  new = _by_shard(new, axis, shards, None)
  at = at[: axis + 1] + (jnp.zeros((), jnp.int32),) + at[axis + 1 :]
  return jax.lax.dynamic_update_slice(view, new, at).reshape(x.shape)


def cache_sizes(model_config, length: int) -> list[int]:
  """Slots per layer for a cache of `length` steps (ring = min(window, L))."""
  cfg = architecture.ModelConfig.from_config(model_config)
  return [
      length if cfg.is_global(i) else min(cfg.window(i), length)
      for i in range(cfg.num_layers)
  ]


def init_cache(
    model_config, batch: int, length: int, per_layer: bool = False
) -> Cache:
  """An empty KV cache for `batch` rows and `length` steps (prompt + new).

  Returns {stack: {"block_j": {"k", "v": [n, B, kv_heads, S_j, head_dim] in
  `config.model.dtype` (int8 with `kv_cache_dtype="int8"`, beside "k_scale",
  "v_scale": float32[n, B, kv_heads, S_j]), "pos": int32[n, B, S_j] = -1}}},
  stacked like the parameters (n groups in the stack), with S_j = length for
  global layers and min(window, length) for sliding ones; with `per_layer`,
  {"layer_i": {"k", "v": [B, kv_heads, S_i, head_dim], "pos": int32[B,
  S_i]}} for `Transformer(per_layer=True)` (`spade.model.transformer`).
  Inside a jit under a mesh the entries are constrained to `CACHE_AXES`
  (rows over the batch axes, KV heads over tensor where they divide it).
  """
  cfg = architecture.ModelConfig.from_config(model_config)
  sizes = cache_sizes(cfg, length)
  rows = (batch, cfg.num_kv_heads)
  # Each leaf: (shape past the layer axis, S for the slots; dtype; fill).
  kv_dtype = jnp.dtype(cfg.kv_cache_dtype or cfg.dtype)
  leaves = {
      "k": ((*rows, "S", cfg.head_dim), kv_dtype, 0),
      "v": ((*rows, "S", cfg.head_dim), kv_dtype, 0),
      "pos": ((batch, "S"), jnp.int32, -1),
  }
  if cfg.kv_cache_dtype == "int8":
    leaves["k_scale"] = ((*rows, "S"), jnp.float32, 0)
    leaves["v_scale"] = ((*rows, "S"), jnp.float32, 0)

  def make(slots: int, lead: tuple[int, ...]) -> dict[str, Array]:
    axes = (
        (lambda key: CACHE_AXES[key])
        if lead
        else (lambda key: CACHE_AXES[key][1:])
    )
    return {
        key: _constrain(
            jnp.full(
                lead + tuple(slots if d == "S" else d for d in shape),
                fill,
                dtype,
            ),
            *axes(key),
        )
        for key, (shape, dtype, fill) in leaves.items()
    }

  if per_layer:
    return {f"layer_{i}": make(sizes[i], ()) for i in range(cfg.num_layers)}
  cache = {}
  for name, first, groups, size in cfg.stacks():
    cache[name] = {
        f"block_{j}": make(sizes[first + j], (groups,)) for j in range(size)
    }
  return cache


def _write_cache(
    layer_cache: dict[str, Array],
    k: Array,
    v: Array,
    pos: Array,
    cache_index: Array,
) -> dict[str, Array]:
  """Writes L new entries at slots (cache_index + j) % size of the buffers.

  k, v: [B, kv_heads, L, head_dim]; pos: [B, L]. A global layer's buffer
  must have room (cache_index + L <= size); callers size it (the sampler
  uses prompt bucket + max_new_tokens). Ring buffers (sliding layers) wrap
  and keep the last `size` entries.
  """
  size = layer_cache["pos"].shape[1]
  length = pos.shape[1]
  new = _entries(layer_cache, k, v, pos)
  axis = lambda name: slot_axis(name, stacked=False)
  if length == 1 or length < size:
    start = cache_index % size
    if length == 1:
      zero = jnp.zeros((), jnp.int32)

      def at(name):
        at = [zero] * layer_cache[name].ndim
        at[axis(name)] = start
        return tuple(at)

      # (A gathered prefix of the rows writes each shard's first rows.)
      return {
          name: _put_rows(
              layer_cache[name],
              new[name].astype(layer_cache[name].dtype),
              0,
              at(name),
              name,
          )
          for name in new
      }
    slots = (start + jnp.arange(length)) % size
    return {
        name: (
            layer_cache[name]
            .at[(slice(None),) * axis(name) + (slots,)]
            .set(new[name].astype(layer_cache[name].dtype))
        )
        for name in new
    }
  # At least `size` new entries: only the last `size` survive; entry
  # cache_index + L - size + j lands in slot (cache_index + L - size + j) % size.
  shift = (cache_index + length - size) % size
  return {
      name: jnp.roll(
          jax.lax.slice_in_dim(
              new[name], length - size, length, axis=axis(name)
          ).astype(layer_cache[name].dtype),
          shift,
          axis=axis(name),
      )
      for name in new
  }


def write(
    cache: dict[str, Array],
    index: Array | None,
    k: Array,
    v: Array,
    pos: Array,
    cache_index: Array,
) -> dict[str, Array]:
  """`_write_cache` on layer `index` of a stacked cache ([layers, ...]).

  A one-token step writes its slot straight into the stacked buffers, so the
  decode loop updates them in place instead of rewriting a layer's buffer.
  """
  if index is None:  # a per-layer cache (`Transformer(per_layer=True)`)
    return _write_cache(cache, k, v, pos, cache_index)
  if pos.shape[1] == 1:
    new = _entries(cache, k, v, pos)
    slot = cache_index % cache["pos"].shape[-1]
    zero = jnp.zeros((), jnp.int32)

    def start(name):
      at = [index] + [zero] * (cache[name].ndim - 1)
      at[slot_axis(name)] = slot
      return tuple(at)

    return {
        name: _put_rows(
            cache[name],
            new[name][None].astype(cache[name].dtype),
            1,
            start(name),
            name,
        )
        for name in new
    }
  layer = layer_view(cache, index)
  written = _write_cache(layer, k, v, pos, cache_index)
  return {
      name: jax.lax.dynamic_update_index_in_dim(
          cache[name], written[name], index, 0
      )
      for name in written
  }


def layer_view(
    cache: dict[str, Array], index: Array | None
) -> dict[str, Array]:
  """Layer `index` of a stacked cache; a per-layer cache (None) as is."""
  if index is None:
    return cache
  return {
      name: jax.lax.dynamic_index_in_dim(value, index, 0, keepdims=False)
      for name, value in cache.items()
  }
