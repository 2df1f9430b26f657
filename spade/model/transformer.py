"""The shared decoder: Gemma 3 and Qwen2 with one set of layers, two heads.

One Flax Linen module covers both families; `config.model` switches the parts
that differ (post norms, q/k norm, q/k/v biases, sliding-window layers, the MLP
activation, embedding scaling). There is no forked copy per family.

Parameter sharing between the roles. Both roles run the same trunk, so these
parameters are SHARED by the designer and the agent:

  embedder/input_embedding, every layer (norms, attention projections, q/k
  norms, MLP), final_norm/scale.

Only the output layer is per role:

  heads/designer/unembedding   used when `role == Role.DESIGNER`
  heads/agent/unembedding      used when `role == Role.AGENT`

`config.model.tie_embeddings` says whether the *checkpoint* ties its output
layer to the input embedding (the loaders read it); in this module the two
heads are always separate parameters, initialised from the checkpoint's output
layer when a checkpoint is loaded, and randomly in a scratch init.

Layers run under `nn.scan`, so the program (and its compile time) does not
grow with depth. Gemma 3 repeats a period of `global_every` layers (sliding,
..., sliding, global), and a period is the scanned unit: layer g * P + j is
`layers/block_j` at index g of the leading axis, P = `global_every` when
`sliding_window` > 0 and 1 otherwise (every layer global, as in Qwen2). The
num_layers % P layers after the last full period (all sliding) are the second
stack, `tail/block_j`, scanned once. Every layer parameter thus has a leading
"layers" axis:

  layers/block_j/{attn/{q,k,v,o}_proj, attn/{q,k}_norm, mlp/{gate,up,down},
                  pre_attention_norm, ...}        [num_layers // P, ...]
  tail/block_j/...                                [1, ...]

Loaders build one subtree per layer (`layer_0`, `layer_1`, ...) and end with
`to_model_layout`, which stacks them; `to_per_layer_layout` undoes it. In the
training forward each layer is rematerialised with the policy
`config.model.remat` names (`REMAT_POLICIES`).

Every parameter carries logical axis names ("layers", "vocab", "embed",
"heads", "kv_heads", "head_dim", "mlp"), listed once in `PARAM_AXES`;
activations are constrained with ("batch", "length", ...) names.
`spade.model.sharding` maps them onto a mesh with the rule table in
`config.mesh.rules`.

Precision: `config.model.dtype` is the activations' and the KV cache's type;
every matmul accumulates in float32 (`preferred_element_type`), and norms,
RoPE, the MLP's activation, softmax, logits and log-probs are float32.
`config.model.param_dtype` is the stored parameters' type.

Decoding uses a KV cache made by `init_cache`, stacked like the parameters:
per block the keys and values (RoPE already applied) and the position of each
slot (-1 = empty), with the leading layer axis. A global layer's cache holds
the whole sequence; a sliding-window layer's cache is a ring buffer of
`min(window, length)` slots, slot = time % size. Attention masks are computed
from positions: a key is visible when its slot is filled, its position is <=
the query's and, on a sliding layer, query - key < window.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any, Callable, Mapping, NamedTuple

import flax.linen as nn
import jax
from jax.ad_checkpoint import checkpoint_name
import jax.numpy as jnp
import ml_collections
import numpy as np

Array = jax.Array
Params = Mapping[str, Any]
Cache = dict[str, dict[str, dict[str, Array]]]

# The mask value Gemma uses: finite, so a row with no visible key (a padding
# query) gives a uniform softmax instead of NaN.
_MASK_VALUE = -2.3819763e38


class Role(enum.IntEnum):
  """Which head produces the logits."""

  DESIGNER = 0
  AGENT = 1


ROLE_HEADS = {Role.DESIGNER: "designer", Role.AGENT: "agent"}

# Logical axis names of every parameter, keyed by the last two path parts
# (module name, parameter name). The module declares its parameters with these
# names and `param_logical_axes` reads them back for plain (unboxed) trees.
PARAM_AXES = {
    ("embedder", "input_embedding"): ("vocab", "embed"),
    ("q_proj", "kernel"): ("embed", "heads", "head_dim"),
    ("q_proj", "bias"): ("heads", "head_dim"),
    ("k_proj", "kernel"): ("embed", "kv_heads", "head_dim"),
    ("k_proj", "bias"): ("kv_heads", "head_dim"),
    ("v_proj", "kernel"): ("embed", "kv_heads", "head_dim"),
    ("v_proj", "bias"): ("kv_heads", "head_dim"),
    ("o_proj", "kernel"): ("heads", "head_dim", "embed"),
    ("q_norm", "scale"): ("head_dim",),
    ("k_norm", "scale"): ("head_dim",),
    ("pre_attention_norm", "scale"): ("embed",),
    ("post_attention_norm", "scale"): ("embed",),
    ("pre_ffw_norm", "scale"): ("embed",),
    ("post_ffw_norm", "scale"): ("embed",),
    ("final_norm", "scale"): ("embed",),
    ("gate", "kernel"): ("embed", "mlp"),
    ("up", "kernel"): ("embed", "mlp"),
    ("down", "kernel"): ("mlp", "embed"),
    ("designer", "unembedding"): ("vocab", "embed"),
    ("agent", "unembedding"): ("vocab", "embed"),
}

# The two stacks of scanned layers (see the module docstring).
STACKS = ("layers", "tail")

# Logical names of the KV cache entries.
# k and v are [layers, batch * kv_heads, slots, head_dim] (row b * kv_heads + j
# is KV head j of row b); pos is [layers, batch, slots].
CACHE_AXES = {
    "k": ("layers", "batch", "length", "head_dim"),
    "v": ("layers", "batch", "length", "head_dim"),
    "pos": ("layers", "batch", "length"),
}

# `config.model.remat`: what the backward pass keeps of each layer's forward
# (MaxText's names). Names saved by the `save_*` policies are set with
# `checkpoint_name` in the layers: query_proj, key_proj, value_proj (q, k, v
# after their projections), context (attention output before o_proj),
# out_proj, mlpwi (gate and up), mlpwo (down). "none" keeps everything (no
# remat); "full" keeps only each layer's input; "minimal" keeps the outputs
# of the weight matmuls.
_QKV = ("query_proj", "key_proj", "value_proj")
REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "minimal": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
    "save_dot_with_context_except_mlp": (
        jax.checkpoint_policies.save_only_these_names(
            *_QKV, "context", "out_proj"
        )
    ),
    "save_dot_except_mlpwi": jax.checkpoint_policies.save_only_these_names(
        *_QKV, "out_proj", "mlpwo"
    ),
    "save_dot_except_mlp": jax.checkpoint_policies.save_only_these_names(
        *_QKV, "out_proj"
    ),
    "save_qkv_proj": jax.checkpoint_policies.save_only_these_names(*_QKV),
    "save_out_proj": jax.checkpoint_policies.save_only_these_names("out_proj"),
}
# Other spellings accepted for the same policies.
_REMAT_ALIASES = {"save_dots_except_mlp": "save_dot_except_mlp"}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hashable copy of `config.model` (see spade/config.py for each key)."""

  family: str = "gemma3"
  vocab_size: int = 259
  embed_dim: int = 64
  num_layers: int = 2
  num_heads: int = 4
  num_kv_heads: int = 2
  head_dim: int = 16
  mlp_dim: int = 128
  sliding_window: int = 0
  global_every: int = 6
  rope_local_base: float = 10_000.0
  rope_global_base: float = 1_000_000.0
  rope_global_scale: float = 1.0
  query_scale: float = 0.0
  qk_norm: bool = True
  qkv_bias: bool = False
  mlp_activation: str = "gelu"
  tie_embeddings: bool = True
  scale_embeddings: bool = True
  norm_eps: float = 1e-6
  max_len: int = 1024
  dtype: str = "float32"
  param_dtype: str = "float32"
  remat: str = "none"
  scan_decode: bool = False
  attention_chunk: int = 0

  @classmethod
  def from_config(cls, model_config) -> "ModelConfig":
    """Builds from `config.model` (a ConfigDict), a mapping or a ModelConfig."""
    if isinstance(model_config, ModelConfig):
      return model_config
    if isinstance(model_config, ml_collections.ConfigDict):
      model_config = model_config.to_dict()
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(model_config) - names)
    if unknown:
      raise ValueError(
          f"unknown model config keys {unknown}; the known keys are the fields"
          " of spade.model.transformer.ModelConfig"
      )
    values = dict(model_config)
    remat = values.get("remat", "none")
    if isinstance(remat, bool):  # the older boolean form of the key
      remat = "full" if remat else "none"
    remat = _REMAT_ALIASES.get(remat, remat)
    if remat not in REMAT_POLICIES:
      raise ValueError(
          f"config.model.remat={remat!r} is not one of"
          f" {sorted(REMAT_POLICIES)}"
      )
    values["remat"] = remat
    return cls(**values)

  @property
  def period(self) -> int:
    """Layers per scanned block: `global_every` with sliding layers, else 1."""
    return self.global_every if self.sliding_window else 1

  def stacks(self) -> list[tuple[str, int, int, int]]:
    """The scanned stacks: (name, first layer, length, layers per block).

    Layer `first + g * size + j` is block j at index g of stack `name`.
    """
    p = self.period
    full, rest = divmod(self.num_layers, p)
    out = []
    if full:
      out.append((STACKS[0], 0, full, p))
    if rest:
      out.append((STACKS[1], full * p, 1, rest))
    return out

  def is_global(self, layer: int) -> bool:
    """Whether layer `layer` attends globally (else over the sliding window)."""
    if self.sliding_window == 0:
      return True
    return (layer + 1) % self.global_every == 0

  def window(self, layer: int) -> int:
    """The layer's attention window in positions; 0 means unlimited."""
    return 0 if self.is_global(layer) else self.sliding_window

  def rope_base(self, layer: int) -> float:
    """RoPE base frequency of layer `layer`."""
    if self.is_global(layer):
      return self.rope_global_base
    return self.rope_local_base


# Published sizes. Gemma 3 rows follow the Gemma 3 technical report / HF
# configs; keys are the `config.model` keys they set.
_GEMMA3 = {
    "270m": dict(
        num_layers=18, embed_dim=640, num_heads=4, num_kv_heads=1,
        head_dim=256, mlp_dim=2048, sliding_window=512, query_scale=256.0,
    ),
    "1b": dict(
        num_layers=26, embed_dim=1152, num_heads=4, num_kv_heads=1,
        head_dim=256, mlp_dim=6912, sliding_window=512, query_scale=256.0,
    ),
    "4b": dict(
        num_layers=34, embed_dim=2560, num_heads=8, num_kv_heads=4,
        head_dim=256, mlp_dim=10240, sliding_window=1024, query_scale=256.0,
        rope_global_scale=8.0,
    ),
    "12b": dict(
        num_layers=48, embed_dim=3840, num_heads=16, num_kv_heads=8,
        head_dim=256, mlp_dim=15360, sliding_window=1024, query_scale=256.0,
        rope_global_scale=8.0,
    ),
    "27b": dict(
        num_layers=62, embed_dim=5376, num_heads=32, num_kv_heads=16,
        head_dim=128, mlp_dim=21504, sliding_window=1024, query_scale=168.0,
        rope_global_scale=8.0,
    ),
}  # fmt: skip


def gemma3_shapes(name: str) -> dict[str, Any]:
  """`config.model` values for a Gemma 3 size: "270m", "1b", "4b", "12b", "27b".

  Use as `config.model.update(gemma3_shapes("270m"))`.
  """
  if name not in _GEMMA3:
    raise ValueError(
        f"unknown Gemma 3 size {name!r}; choose one of {sorted(_GEMMA3)}"
    )
  values = dict(
      family="gemma3",
      vocab_size=262_144,
      global_every=6,
      rope_local_base=10_000.0,
      rope_global_base=1_000_000.0,
      rope_global_scale=1.0,  # 4B and up: 8 (linear, global layers only)
      qk_norm=True,
      qkv_bias=False,
      mlp_activation="gelu",
      tie_embeddings=True,
      scale_embeddings=True,
      norm_eps=1e-6,
  )
  values.update(_GEMMA3[name])
  return values


def qwen2_shapes(name: str = "0.5b") -> dict[str, Any]:
  """`config.model` values for Qwen2.5 (Coder) 0.5B, the one size used here."""
  if name != "0.5b":
    raise ValueError(f"unknown Qwen2.5 size {name!r}; only '0.5b' is defined")
  return dict(
      family="qwen2",
      vocab_size=151_936,
      embed_dim=896,
      num_layers=24,
      num_heads=14,
      num_kv_heads=2,
      head_dim=64,
      mlp_dim=4864,
      sliding_window=0,
      global_every=1,
      rope_local_base=1_000_000.0,
      rope_global_base=1_000_000.0,
      rope_global_scale=1.0,
      query_scale=0.0,
      qk_norm=False,
      qkv_bias=True,
      mlp_activation="silu",
      tie_embeddings=True,
      scale_embeddings=False,
      norm_eps=1e-6,
  )


# Qwen3 dense (the Hugging Face configs): layers, embed, heads, kv heads, MLP,
# tied. All have head_dim 128, RoPE base 1e6 and a 151,936-token vocabulary.
_QWEN3 = {
    "0.6b": (28, 1024, 16, 8, 3072, True),
    "1.7b": (28, 2048, 16, 8, 6144, True),
    "4b": (36, 2560, 32, 8, 9728, True),
    "8b": (36, 4096, 32, 8, 12288, False),
}


def qwen3_shapes(name: str) -> dict[str, Any]:
  """`config.model` values for Qwen3 dense: "0.6b", "1.7b", "4b", "8b".

  Qwen2's layer without q/k/v biases, with an RMSNorm on each query and key
  head (the full multiplier, as Hugging Face stores it).
  """
  if name not in _QWEN3:
    raise ValueError(
        f"unknown Qwen3 size {name!r}; choose one of {sorted(_QWEN3)}"
    )
  layers, embed, heads, kv_heads, mlp, tied = _QWEN3[name]
  return dict(
      family="qwen3",
      vocab_size=151_936,
      embed_dim=embed,
      num_layers=layers,
      num_heads=heads,
      num_kv_heads=kv_heads,
      head_dim=128,
      mlp_dim=mlp,
      sliding_window=0,
      global_every=1,
      rope_local_base=1_000_000.0,
      rope_global_base=1_000_000.0,
      rope_global_scale=1.0,
      query_scale=0.0,
      qk_norm=True,
      qkv_bias=False,
      mlp_activation="silu",
      tie_embeddings=tied,
      scale_embeddings=False,
      norm_eps=1e-6,
  )


def _constrain(x: Array, *axes: str | None) -> Array:
  return nn.with_logical_constraint(x, axes)


def _init(init: Callable[..., Array], module: str, name: str):
  return nn.with_logical_partitioning(init, PARAM_AXES[(module, name)])


class RMSNorm(nn.Module):
  """y = x * rsqrt(mean(x^2) + eps) * scale; `scale` is the full multiplier."""

  eps: float
  param_dtype: Any
  axes_key: str = "final_norm"

  @nn.compact
  def __call__(self, x: Array) -> Array:
    scale = self.param(
        "scale",
        _init(nn.initializers.ones, self.axes_key, "scale"),
        (x.shape[-1],),
        self.param_dtype,
    )
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + self.eps)
    return (y * scale.astype(jnp.float32)).astype(x.dtype)


def apply_rope(
    x: Array, positions: Array, base: float, scale: float = 1.0
) -> Array:
  """Rotate-half (GPT-NeoX / HF) RoPE; x: [B, L, N, H], positions: [B, L].

  `scale` > 1 is linear RoPE scaling (Hugging Face's "linear" rope type):
  every frequency divided by it, as if positions were `scale` times closer.
  """
  half = x.shape[-1] // 2
  freq = base ** (-np.arange(half, dtype=np.float32) * 2.0 / x.shape[-1])
  freq = freq / np.float32(scale)
  angle = positions.astype(jnp.float32)[..., None] * jnp.asarray(freq)
  sin = jnp.sin(angle)[:, :, None, :]
  cos = jnp.cos(angle)[:, :, None, :]
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


# The variable collection of low-rank adapters (`spade.train.lora`): a
# module with {"a": A[*in, r], "b": B[r, *out]} in it adds u - sg(u), with
# u = sg(x)·A·B, to its output (B already holds the adapters' scale). The
# kernels are the merged weights the model runs with, so the value is
# theirs exactly and so is the gradient to x (sg(x): the kernel already
# holds A·B), while the gradient reaches A and B without the kernel's own
# gradient (x^T·dy, as costly as the forward matmul) ever being formed.
LORA = "lora"


class Linear(nn.Module):
  """x[..., *in] @ kernel[*in, *features] (+ bias[*features]).

  Written out rather than `nn.DenseGeneral`, whose flattened kernel init
  breaks multi-axis logical partitioning under a mesh.

  Attributes:
    features: output dimensions.
    contract: how many trailing input dimensions are contracted.
    use_bias: add a bias over the output dimensions.
    cfg: the model config (dtypes).
  """

  features: tuple[int, ...]
  contract: int
  use_bias: bool
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x: Array) -> Array:
    c, f = self.contract, len(self.features)
    pdt = jnp.dtype(self.cfg.param_dtype)
    init = nn.initializers.lecun_normal(
        in_axis=tuple(range(c)), out_axis=tuple(range(c, c + f))
    )
    kernel = self.param(
        "kernel",
        _init(init, self.name, "kernel"),
        tuple(x.shape[x.ndim - c :]) + tuple(self.features),
        pdt,
    )
    dtype = jnp.dtype(self.cfg.dtype)
    # Float32 accumulation whatever the activations' type; one rounding to
    # `dtype` at the end.
    y = jax.lax.dot_general(
        x.astype(dtype),
        kernel.astype(dtype),
        ((tuple(range(x.ndim - c, x.ndim)), tuple(range(c))), ((), ())),
        preferred_element_type=jnp.float32,
    )
    if self.has_variable(LORA, "a"):
      a, b = self.get_variable(LORA, "a"), self.get_variable(LORA, "b")
      xa = jax.lax.dot_general(
          jax.lax.stop_gradient(x).astype(dtype),
          a.astype(dtype),
          ((tuple(range(x.ndim - c, x.ndim)), tuple(range(c))), ((), ())),
          preferred_element_type=jnp.float32,
      )
      delta = jax.lax.dot_general(
          xa.astype(dtype),
          b.astype(dtype),
          (((xa.ndim - 1,), (0,)), ((), ())),
          preferred_element_type=jnp.float32,
      )
      y = y + _gradient_only(delta)
    if self.use_bias:
      bias = self.param(
          "bias",
          _init(nn.initializers.zeros, self.name, "bias"),
          tuple(self.features),
          pdt,
      )
      y = y + bias.astype(jnp.float32)
    return y.astype(dtype)


def _gradient_only(delta: Array) -> Array:
  """Zero, with the gradient of `delta` (an adapter's term, see `LORA`)."""
  return delta - jax.lax.stop_gradient(delta)


def _proj(
    name: str, features, contract: int, cfg: ModelConfig, use_bias=False
) -> Linear:
  if isinstance(features, int):
    features = (features,)
  return Linear(tuple(features), contract, use_bias, cfg, name=name)


def _write_cache(
    layer_cache: dict[str, Array],
    k: Array,
    v: Array,
    pos: Array,
    cache_index: Array,
) -> dict[str, Array]:
  """Writes L new entries at slots (cache_index + j) % size of the buffers.

  A global layer's buffer must have room (cache_index + L <= size); callers
  size it (the sampler uses prompt bucket + max_new_tokens). Ring buffers
  (sliding layers) wrap and keep the last `size` entries.
  """
  size = layer_cache["pos"].shape[1]
  length = k.shape[1]
  new = {"k": k, "v": v, "pos": pos}
  if length == 1 or length < size:
    start = cache_index % size
    if length == 1:
      return {
          name: jax.lax.dynamic_update_slice_in_dim(
              layer_cache[name],
              new[name].astype(layer_cache[name].dtype),
              start,
              axis=1,
          )
          for name in new
      }
    slots = (start + jnp.arange(length)) % size
    return {
        name: (
            layer_cache[name]
            .at[:, slots]
            .set(new[name].astype(layer_cache[name].dtype))
        )
        for name in new
    }
  # At least `size` new entries: only the last `size` survive; entry
  # cache_index + L - size + j lands in slot (cache_index + L - size + j) % size.
  shift = (cache_index + length - size) % size
  return {
      name: jnp.roll(
          new[name][:, length - size :].astype(layer_cache[name].dtype),
          shift,
          axis=1,
      )
      for name in new
  }


def _write_stacked(
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
  new = {"k": k, "v": v, "pos": pos}
  if k.shape[1] == 1:
    slot = cache_index % cache["pos"].shape[-1]
    zero = jnp.zeros((), jnp.int32)
    return {
        name: jax.lax.dynamic_update_slice(
            cache[name],
            new[name][None].astype(cache[name].dtype),
            (index, zero, slot) + (zero,) * (cache[name].ndim - 3),
        )
        for name in new
    }
  layer = _layer_view(cache, index)
  written = _write_cache(layer, k, v, pos, cache_index)
  return {
      name: jax.lax.dynamic_update_index_in_dim(
          cache[name], written[name], index, 0
      )
      for name in new
  }


def _layer_view(
    cache: dict[str, Array], index: Array | None
) -> dict[str, Array]:
  """Layer `index` of a stacked cache; a per-layer cache (None) as is."""
  if index is None:
    return cache
  return {
      name: jax.lax.dynamic_index_in_dim(value, index, 0, keepdims=False)
      for name, value in cache.items()
  }


class Attention(nn.Module):
  """GQA with optional q/k norm and q/k/v biases, RoPE, sliding window.

  Attributes:
    cfg: the model config.
    is_global: attend over the whole sequence (else over the sliding window),
      with the global RoPE base (else the local one).
  """

  cfg: ModelConfig
  is_global: bool

  @nn.compact
  def __call__(
      self,
      x: Array,
      positions: Array,
      key_pos: Array,
      cache: dict[str, Array] | None,
      cache_index: Array | None,
      index: Array | None,
  ) -> tuple[Array, dict[str, Array] | None]:
    cfg = self.cfg
    n, kv, h = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    dtype = jnp.dtype(cfg.dtype)
    q = _proj("q_proj", (n, h), 1, cfg, cfg.qkv_bias)(x)
    k = _proj("k_proj", (kv, h), 1, cfg, cfg.qkv_bias)(x)
    v = _proj("v_proj", (kv, h), 1, cfg, cfg.qkv_bias)(x)
    q = checkpoint_name(q, "query_proj")
    k = checkpoint_name(k, "key_proj")
    v = checkpoint_name(v, "value_proj")
    q = _constrain(q, "batch", "length", "heads", "head_dim")
    k = _constrain(k, "batch", "length", "kv_heads", "head_dim")
    v = _constrain(v, "batch", "length", "kv_heads", "head_dim")
    if cfg.qk_norm:
      pdt = jnp.dtype(cfg.param_dtype)
      q = RMSNorm(cfg.norm_eps, pdt, "q_norm", name="q_norm")(q)
      k = RMSNorm(cfg.norm_eps, pdt, "k_norm", name="k_norm")(k)
    if self.is_global:
      base, window = cfg.rope_global_base, 0
      rope_scale = cfg.rope_global_scale
    else:
      base, window = cfg.rope_local_base, cfg.sliding_window
      rope_scale = 1.0
    scale = (cfg.query_scale if cfg.query_scale > 0 else h) ** -0.5
    # RoPE and the query scale in float32, one rounding to `dtype` after.
    q32 = apply_rope(q.astype(jnp.float32), positions, base, rope_scale)
    q = (q32 * jnp.float32(scale)).astype(dtype)
    k = apply_rope(k.astype(jnp.float32), positions, base, rope_scale)
    k = k.astype(dtype)

    b, length = q.shape[:2]
    g = n // kv
    # Attention runs on [batch * kv_heads, ...] operands: the cache is stored
    # in exactly that shape, so the decode step's in-place cache update feeds
    # the attention matmuls without a reshape (a reshape there made XLA copy
    # the whole cache every step).
    qf = q.reshape(b, length, kv, g, h).transpose(0, 2, 3, 1, 4)
    qf = qf.reshape(b * kv, g * length, h)
    kf = k.transpose(0, 2, 1, 3).reshape(b * kv, length, h)
    vf = v.transpose(0, 2, 1, 3).reshape(b * kv, length, h)

    def scores(keys, kpos):
      logits = jnp.einsum(
          "xqh,xsh->xqs",
          qf,
          keys.astype(dtype),
          preferred_element_type=jnp.float32,
      )
      qp = positions[:, :, None]
      kp = kpos[:, None, :]
      visible = (kp >= 0) & (kp <= qp)
      if window:
        visible &= qp - kp < window
      # An additive mask, shared by the heads: its backward is the identity
      # (a select's is another select over the whole score tensor), which
      # made the tiny model's update step ~4% faster on CPU.
      bias = jnp.where(visible, 0.0, _MASK_VALUE).astype(logits.dtype)
      logits = logits.reshape((b, kv, g, length, -1)) + bias[:, None, None]
      return logits.reshape((b * kv, g * length, -1))

    new_cache = None
    chunk = cfg.attention_chunk
    if cache is None and 0 < chunk < length and length % chunk == 0:
      out = _chunked_attention(
          qf.reshape(b * kv, g, length, h), kf, vf, positions, key_pos,
          window, chunk, dtype,
      )  # fmt: skip
      return self._out(out, b, kv, g, length, n, h, cfg), None
    if cache is None:
      parts = [(kf, vf, key_pos)]
    elif length == 1 or window == 0:
      # Write, then attend over the updated cache: a one-token step only
      # overwrites a slot that has left the window, and a global buffer never
      # wraps. (Reading the old buffer and then updating it makes XLA copy
      # the cache every step.)
      new_cache = _write_stacked(cache, index, kf, vf, key_pos, cache_index)
      layer = _layer_view(new_cache, index)
      parts = [(layer["k"], layer["v"], layer["pos"])]
    else:
      # A chunk on a ring buffer can overwrite keys its own earlier queries
      # still need: attend over the old cache plus the chunk, then write.
      layer = _layer_view(cache, index)
      parts = [(layer["k"], layer["v"], layer["pos"]), (kf, vf, key_pos)]
      new_cache = _write_stacked(cache, index, kf, vf, key_pos, cache_index)
    logits = jnp.concatenate([scores(kk, pp) for kk, _, pp in parts], -1)
    probs = jax.nn.softmax(logits, axis=-1)
    out, offset = 0.0, 0
    for kk, vv, _ in parts:
      size = kk.shape[1]
      p = probs[..., offset : offset + size].astype(dtype)
      out = out + jnp.einsum(
          "xqs,xsh->xqh",
          p,
          vv.astype(dtype),
          preferred_element_type=jnp.float32,
      )
      offset += size
    return self._out(out, b, kv, g, length, n, h, cfg), new_cache

  def _out(self, out, b, kv, g, length, n, h, cfg):
    """[b * kv, g * length, h] attention output -> the output projection."""
    out = out.astype(jnp.dtype(cfg.dtype)).reshape(b, kv, g, length, h)
    out = out.transpose(0, 3, 1, 2, 4).reshape(b, length, n, h)
    out = _constrain(out, "batch", "length", "heads", "head_dim")
    out = checkpoint_name(out, "context")
    y = _proj("o_proj", cfg.embed_dim, 2, cfg)(out)
    return checkpoint_name(y, "out_proj")


def _chunked_attention(q, k, v, positions, key_pos, window, chunk, dtype):
  """Attention of `chunk` queries at a time against every key (no cache).

  q: [x, g, L, h] (x = batch * kv_heads, g query heads per kv head); k, v:
  [x, L, h]; positions, key_pos: [batch, L]. Returns [x, g * L, h] float32.
  Each query's softmax runs over all keys at once, so the result is the
  one-block attention's; each block is rematerialised, so a backward pass
  keeps [chunk, L] scores alive instead of [L, L].
  """
  x, g, length, h = q.shape
  b = positions.shape[0]
  n = length // chunk

  @jax.checkpoint
  def block(args):
    qc, qp = args
    logits = jnp.einsum(
        "xgqh,xsh->xgqs", qc, k.astype(dtype),
        preferred_element_type=jnp.float32,
    )  # fmt: skip
    qp, kp = qp[:, :, None], key_pos[:, None, :]
    visible = (kp >= 0) & (kp <= qp)
    if window:
      visible &= qp - kp < window
    bias = jnp.where(visible, 0.0, _MASK_VALUE).astype(logits.dtype)
    logits = logits.reshape((b, x // b, g, chunk, length)) + bias[:, None, None]
    probs = jax.nn.softmax(logits, axis=-1).reshape((x, g, chunk, length))
    return jnp.einsum(
        "xgqs,xsh->xgqh", probs.astype(dtype), v.astype(dtype),
        preferred_element_type=jnp.float32,
    )  # fmt: skip

  qs = q.reshape(x, g, n, chunk, h).transpose(2, 0, 1, 3, 4)
  ps = positions.reshape(b, n, chunk).transpose(1, 0, 2)
  out = jax.lax.map(block, (qs, ps))  # [n, x, g, chunk, h]
  return out.transpose(1, 2, 0, 3, 4).reshape(x, g * length, h)


class MLP(nn.Module):
  """down(act(gate(x)) * up(x)): GeGLU ("gelu") or SwiGLU ("silu")."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x: Array) -> Array:
    cfg = self.cfg
    gate = checkpoint_name(_proj("gate", cfg.mlp_dim, 1, cfg)(x), "mlpwi")
    up = checkpoint_name(_proj("up", cfg.mlp_dim, 1, cfg)(x), "mlpwi")
    gate32 = gate.astype(jnp.float32)
    if cfg.mlp_activation == "gelu":
      act = nn.gelu(gate32, approximate=True)
    elif cfg.mlp_activation == "silu":
      act = nn.silu(gate32)
    else:
      raise ValueError(
          f"config.model.mlp_activation={cfg.mlp_activation!r}: use 'gelu' or"
          " 'silu'"
      )
    hidden = (act * up.astype(jnp.float32)).astype(gate.dtype)
    hidden = _constrain(hidden, "batch", "length", "mlp")
    y = _proj("down", cfg.embed_dim, 1, cfg)(hidden)
    return checkpoint_name(y, "mlpwo")


class Block(nn.Module):
  """One decoder layer; post norms only for the Gemma family."""

  cfg: ModelConfig
  is_global: bool

  @nn.compact
  def __call__(self, x, positions, key_pos, cache, cache_index, index):
    cfg = self.cfg
    pdt = jnp.dtype(cfg.param_dtype)
    gemma = cfg.family == "gemma3"

    def norm(name):
      return RMSNorm(cfg.norm_eps, pdt, name, name=name)

    y, new_cache = Attention(cfg, self.is_global, name="attn")(
        norm("pre_attention_norm")(x),
        positions,
        key_pos,
        cache,
        cache_index,
        index,
    )
    if gemma:
      y = norm("post_attention_norm")(y)
    x = _constrain(x + y, "batch", "length", "embed")
    y = MLP(cfg, name="mlp")(norm("pre_ffw_norm")(x))
    if gemma:
      y = norm("post_ffw_norm")(y)
    x = _constrain(x + y, "batch", "length", "embed")
    return x, new_cache


class _Group(nn.Module):
  """One scanned step: `len(kinds)` consecutive layers (block_0, block_1, ...).

  Attributes:
    cfg: the model config.
    kinds: per block, whether it is a global layer (static).
    remat: rematerialise each block with `REMAT_POLICIES[cfg.remat]`.
  """

  cfg: ModelConfig
  kinds: tuple[bool, ...]
  remat: bool

  @nn.compact
  def __call__(self, carry, index, positions, key_pos, cache_index):
    x, cache = carry
    block = Block
    if self.remat:
      # Inside a scan XLA cannot merge the recomputation with the forward
      # anyway, so CSE prevention would only cost.
      block = nn.remat(
          Block, policy=REMAT_POLICIES[self.cfg.remat], prevent_cse=False
      )
    layers = [(f"block_{j}", g) for j, g in enumerate(self.kinds)]
    x, new_cache = _run_blocks(
        block, self.cfg, layers, x, positions, key_pos, cache, cache_index,
        index,
    )  # fmt: skip
    return (x, new_cache), None


def _run_blocks(
    block, cfg, layers, x, positions, key_pos, cache, cache_index, index
):
  """Runs `block` layers in order, (name, is_global) each, under the calling
  module; layer `name` reads and writes `cache[name]`. Returns (x, cache)."""
  new_cache = None if cache is None else dict(cache)
  for name, is_global in layers:
    x, layer_cache = block(cfg, is_global, name=name)(
        x,
        positions,
        key_pos,
        None if cache is None else cache[name],
        cache_index,
        index,
    )
    if cache is not None:
      new_cache[name] = layer_cache
  return x, new_cache


def _stack(
    cfg: ModelConfig, name: str, first: int, length: int, size: int, remat
) -> nn.Module:
  """One `nn.scan` over `length` groups of `size` layers, params stacked."""
  kinds = tuple(cfg.is_global(first + j) for j in range(size))
  scanned = nn.scan(
      _Group,
      variable_axes={"params": 0, LORA: 0},
      split_rngs={"params": True},
      in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast),
      length=length,
      metadata_params={nn.PARTITION_NAME: "layers"},
  )
  return scanned(cfg, kinds, remat, name=name)


class Transformer(nn.Module):
  """The shared decoder with a designer head and an agent head.

  Attributes:
    cfg: `config.model` as a ConfigDict, a mapping or a `ModelConfig`.
    per_layer: run the layers as a Python loop over one `layer_i` subtree
      each (`to_per_layer_layout`), with a per-layer cache (`init_cache(...,
      per_layer=True)`): the decoding layout (`sampling_fns`). A scanned
      stack slices each layer's weights and cache out of the stacked arrays
      at every step, and XLA on CPU copies those slices: batch-8 decoding
      of Gemma 3 270M took 412 ms per step scanned against 101 ms per layer.
  """

  cfg: Any
  per_layer: bool = False

  def __post_init__(self):
    if not isinstance(self.cfg, ModelConfig):
      object.__setattr__(self, "cfg", ModelConfig.from_config(self.cfg))
    super().__post_init__()

  @nn.compact
  def __call__(
      self,
      tokens: Array,
      positions: Array,
      role: Role,
      *,
      input_mask: Array | None = None,
      cache: Cache | None = None,
      cache_index: Array | None = None,
      last_only: bool = False,
      targets: Array | None = None,
      chunk: int = 256,
      score_mask: Array | None = None,
  ) -> tuple[Array, Cache | None]:
    """Runs the decoder.

    Args:
      tokens: int32[B, L].
      positions: int32[B, L], the RoPE position of each token; attention is
        causal by position (a key is visible when its position is <= the
        query's), so positions must increase along each row's real tokens.
      role: which head gives the logits (static).
      input_mask: bool[B, L], False for padding; padding is never attended to.
        Default: all True.
      cache: from `init_cache`, or None for a plain full forward.
      cache_index: int32 scalar, the cache time of `tokens[:, 0]` (the number
        of steps already written); required with `cache`.
      last_only: return logits for the last position only ([B, 1, V]); the
        sampler's prefill needs no more and the vocab matmul dominates.
      targets: int32[B, L]; when given, return instead the float32 [B, L]
        log-probability of `targets[:, t]` under position t's logits,
        computed `chunk` positions at a time with rematerialisation, so the
        [B, L, V] logits never exist at once (the update's memory for a
        150k-262k vocabulary).
      chunk: positions per chunk with `targets`.
      score_mask: optional bool[B, L] with `targets`: the positions whose
        log-probability is needed; a chunk with none in any row is not
        computed (its log-probabilities are 0), so a long prompt costs no
        vocabulary matmuls.

    Returns:
      (float32 logits [B, L, V] (or [B, 1, V]) or target logprobs [B, L],
      the updated cache or None).
    """
    cfg = self.cfg
    if cache is not None and cache_index is None:
      raise ValueError("Transformer: pass cache_index together with cache")
    if input_mask is None:
      input_mask = jnp.ones(tokens.shape, bool)
    key_pos = jnp.where(input_mask, positions, -1).astype(jnp.int32)
    dtype = jnp.dtype(cfg.dtype)
    pdt = jnp.dtype(cfg.param_dtype)

    embedding = _Embedder(cfg, name="embedder")()
    x = jnp.take(embedding, tokens, axis=0).astype(dtype)
    if cfg.scale_embeddings:
      x = x * jnp.sqrt(float(cfg.embed_dim)).astype(dtype)
    x = _constrain(x, "batch", "length", "embed")

    new_cache = {} if cache is not None else None
    # Training (no cache) can keep only what the remat policy saves of each
    # layer and recompute the rest in the backward pass: attention scores
    # and MLP activations of every layer at once do not fit a real model's
    # update in host memory.
    remat = cfg.remat != "none" and cache is None
    if self.per_layer:
      block = Block
      if remat:
        block = nn.remat(Block, policy=REMAT_POLICIES[cfg.remat])
      layers = [(f"layer_{i}", cfg.is_global(i)) for i in range(cfg.num_layers)]
      x, new_cache = _run_blocks(
          block, cfg, layers, x, positions, key_pos, cache, cache_index, None
      )
    for name, first, length, size in [] if self.per_layer else cfg.stacks():
      (x, stack_cache), _ = _stack(cfg, name, first, length, size, remat)(
          (x, None if cache is None else cache[name]),
          jnp.arange(length, dtype=jnp.int32),
          positions,
          key_pos,
          cache_index,
      )
      if cache is not None:
        new_cache[name] = stack_cache
    if last_only:
      x = x[:, -1:]
    x = RMSNorm(cfg.norm_eps, pdt, "final_norm", name="final_norm")(x)

    if targets is not None:
      table, factors = _Heads(cfg, name="heads")(x, Role(role), table_only=True)
      logp = chunked_logprobs(x, table, targets, chunk, score_mask, factors)
      return logp, new_cache
    logits = _Heads(cfg, name="heads")(x, Role(role))
    return _constrain(logits, "batch", "length", "vocab"), new_cache


def chunked_logprobs(
    x: Array,
    table: Array,
    targets: Array,
    chunk: int,
    score_mask: Array | None = None,
    factors: tuple[Array, Array] | None = None,
) -> Array:
  """log softmax(x @ table.T)[targets], `chunk` positions at a time.

  Each chunk's logits are recomputed in the backward pass
  (`jax.checkpoint`), so memory holds [B, chunk, V] logits, not [B, L, V].

  Args:
    x: [B, L, E] final hidden states.
    table: [V, E] the role's unembedding.
    targets: int32[B, L] token ids to score.
    chunk: positions per chunk.
    score_mask: optional bool[B, L], the positions needed: a chunk without
      one (in any row) skips its matmul, forward and backward (`lax.cond`),
      and gives 0.
    factors: optional adapter factors (A[V, r], B[r, E]) of the table (see
      `LORA`): gradient only, the value is the table's.

  Returns:
    float32[B, L].
  """
  b, length, e = x.shape
  chunk = max(1, min(chunk, length))
  n = -(-length // chunk)
  pad = n * chunk - length
  xs = jnp.pad(x, ((0, 0), (0, pad), (0, 0))).reshape(b, n, chunk, e)
  ts = jnp.pad(targets, ((0, 0), (0, pad))).reshape(b, n, chunk)
  table = table.astype(x.dtype)
  if score_mask is None:
    needed = jnp.ones((n,), bool)
  else:
    needed = jnp.pad(score_mask.astype(bool), ((0, 0), (0, pad)))
    needed = jnp.any(needed.reshape(b, n, chunk), axis=(0, 2))

  def score(xc, tc):
    logits = _head_logits(xc, table, factors)
    picked = jnp.take_along_axis(logits, tc[..., None], axis=-1)[..., 0]
    return picked - jax.nn.logsumexp(logits, axis=-1)

  def skip(xc, tc):
    del xc
    return jnp.zeros(tc.shape, jnp.float32)

  @jax.checkpoint
  def one(args):
    xc, tc, need = args
    if score_mask is None:
      return score(xc, tc)
    return jax.lax.cond(need, score, skip, xc, tc)

  out = jax.lax.map(
      one, (xs.transpose(1, 0, 2, 3), ts.transpose(1, 0, 2), needed)
  )
  return out.transpose(1, 0, 2).reshape(b, n * chunk)[:, :length]


class _Embedder(nn.Module):
  """The [vocab, embed] input embedding table."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self) -> Array:
    return self.param(
        "input_embedding",
        _init(
            nn.initializers.variance_scaling(1.0, "fan_in", "normal", 1, 0),
            "embedder",
            "input_embedding",
        ),
        (self.cfg.vocab_size, self.cfg.embed_dim),
        jnp.dtype(self.cfg.param_dtype),
    )


def _head_logits(
    x: Array, table: Array, factors: tuple[Array, Array] | None
) -> Array:
  """float32 x[B, L, E] @ table[V, E].T, plus an adapter's gradient-only term."""
  logits = jnp.einsum(
      "ble,ve->blv", x, table.astype(x.dtype),
      preferred_element_type=jnp.float32,
  )  # fmt: skip
  if factors is not None:
    a, b = factors
    xb = jnp.einsum(
        "ble,re->blr", jax.lax.stop_gradient(x), b.astype(x.dtype),
        preferred_element_type=jnp.float32,
    )  # fmt: skip
    delta = jnp.einsum(
        "blr,vr->blv", xb.astype(x.dtype), a.astype(x.dtype),
        preferred_element_type=jnp.float32,
    )  # fmt: skip
    logits = logits + _gradient_only(delta)
  return logits


class _Heads(nn.Module):
  """Holds both unembeddings (so both exist after init) and applies one."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x: Array, role: Role, table_only: bool = False):
    """float32 logits [B, L, V]; with `table_only`, (the role's table, its
    adapter factors or None) instead."""
    heads = {
        r: _UnembeddingHead(self.cfg, name=head)()
        for r, head in ROLE_HEADS.items()
    }
    if table_only:
      return heads[role]
    return _head_logits(x, *heads[role])


class _UnembeddingHead(nn.Module):
  """One role's [vocab, embed] output table (and its adapter factors)."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self) -> tuple[Array, tuple[Array, Array] | None]:
    table = self.param(
        "unembedding",
        _init(
            nn.initializers.variance_scaling(1.0, "fan_in", "normal", 1, 0),
            self.name,
            "unembedding",
        ),
        (self.cfg.vocab_size, self.cfg.embed_dim),
        jnp.dtype(self.cfg.param_dtype),
    )
    factors = None
    if self.has_variable(LORA, "a"):
      factors = (self.get_variable(LORA, "a"), self.get_variable(LORA, "b"))
    return table, factors


def build_model(model_config) -> Transformer:
  """The decoder for `config.model` (a ConfigDict, mapping or ModelConfig)."""
  return Transformer(ModelConfig.from_config(model_config))


def init_params(model_config, rng: Array) -> dict[str, Any]:
  """A scratch init: plain (unboxed) float params in the contract's tree.

  Both heads are drawn independently; the loaders in
  `spade.model.checkpoints` replace everything with checkpoint weights.
  """
  model = build_model(model_config)
  tokens = jnp.zeros((1, 1), jnp.int32)
  variables = jax.jit(lambda r: model.init(r, tokens, tokens, Role.DESIGNER))(
      rng
  )
  return nn.unbox(variables["params"])


def param_logical_axes(params: Params) -> Any:
  """A tree like `params` of logical `PartitionSpec`s (from `PARAM_AXES`).

  Works on plain trees (the loaders' output), so checkpoint weights shard the
  same way as a scratch init. Leaves of the scanned stacks (`STACKS`) lead
  with the "layers" axis.
  """

  def axes(path, leaf):
    names = tuple(getattr(p, "key", str(p)) for p in path)
    key = names[-2:]
    if key not in PARAM_AXES:
      raise ValueError(
          f"parameter {'/'.join(names)} has no logical axes; add "
          f"{key} to spade.model.transformer.PARAM_AXES"
      )
    spec = PARAM_AXES[key]
    if names[0] in STACKS:
      spec = ("layers",) + spec
    if len(spec) != np.ndim(leaf):
      raise ValueError(
          f"parameter {'/'.join(names)} has shape {np.shape(leaf)} but its "
          f"logical axes are {spec}"
      )
    return jax.sharding.PartitionSpec(*spec)

  return jax.tree_util.tree_map_with_path(axes, nn.unbox(params))


def cache_sizes(model_config, length: int) -> list[int]:
  """Slots per layer for a cache of `length` steps (ring = min(window, L))."""
  cfg = ModelConfig.from_config(model_config)
  return [
      length if cfg.is_global(i) else min(cfg.window(i), length)
      for i in range(cfg.num_layers)
  ]


def init_cache(
    model_config, batch: int, length: int, per_layer: bool = False
) -> Cache:
  """An empty KV cache for `batch` rows and `length` steps (prompt + new).

  Returns {stack: {"block_j": {"k", "v": [n, B * kv_heads, S_j, head_dim] in
  `config.model.dtype`, "pos": int32[n, B, S_j] = -1}}}, stacked like the
  parameters (n groups in the stack), with S_j = length for global layers and
  min(window, length) for sliding ones; with `per_layer`, {"layer_i": {"k",
  "v": [B * kv_heads, S_i, head_dim], "pos": int32[B, S_i]}} for
  `Transformer(per_layer=True)`. Inside a jit under a mesh the entries are
  constrained to `CACHE_AXES` (batch-sharded).
  """
  cfg = ModelConfig.from_config(model_config)
  dtype = jnp.dtype(cfg.dtype)
  sizes = cache_sizes(cfg, length)
  if per_layer:
    shapes = {
        "k": (batch * cfg.num_kv_heads, None, cfg.head_dim),
        "v": (batch * cfg.num_kv_heads, None, cfg.head_dim),
        "pos": (batch, None),
    }
    return {
        f"layer_{i}": {
            key: _constrain(
                jnp.full(
                    tuple(sizes[i] if d is None else d for d in shape),
                    -1 if key == "pos" else 0,
                    jnp.int32 if key == "pos" else dtype,
                ),
                *CACHE_AXES[key][1:],
            )
            for key, shape in shapes.items()
        }
        for i in range(cfg.num_layers)
    }
  cache = {}
  for name, first, groups, size in cfg.stacks():
    cache[name] = {}
    for j in range(size):
      slots = sizes[first + j]
      shape = (groups, batch * cfg.num_kv_heads, slots, cfg.head_dim)
      block = {
          "k": jnp.zeros(shape, dtype),
          "v": jnp.zeros(shape, dtype),
          "pos": jnp.full((groups, batch, slots), -1, jnp.int32),
      }
      cache[name][f"block_{j}"] = {
          key: _constrain(value, *CACHE_AXES[key])
          for key, value in block.items()
      }
  return cache


class SamplingFns(NamedTuple):
  """What `spade.sampling.Sampler` takes for one role (`Sampler(*fns, ...)`).

  tokens_to_logits(params, tokens, positions, input_mask, cache, cache_index)
  -> (float32 logits [B, V] of the LAST position, new cache), on parameters
  in the decoding layout that `prepare_params` makes once per call from the
  model's own (stacked) layout; init_cache(batch, length) -> cache;
  share_prefix: the granularity of prefix sharing the cache allows (0: none).
  """

  tokens_to_logits: Callable[..., tuple[Array, Cache]]
  init_cache: Callable[[int, int], Cache]
  prepare_params: Callable[[Params], Params]
  share_prefix: int


def sampling_fns(model_config, role: Role) -> SamplingFns:
  """The sampler's callables for one role: decoding runs `per_layer`.

  `prepare_params` unstacks the scanned layers once per sampler call (one
  copy of the layer weights), so the decode loop reads each layer's weights
  and cache in place instead of slicing them out of the stacks every step.
  With `config.model.scan_decode` the scanned model decodes on the stacked
  parameters as given (no copy; slower on CPU).
  """
  cfg = ModelConfig.from_config(model_config)
  per_layer = not cfg.scan_decode
  model = Transformer(cfg, per_layer=per_layer)
  role = Role(role)

  def tokens_to_logits(params, tokens, positions, input_mask, cache, index):
    logits, cache = model.apply(
        {"params": params},
        tokens,
        positions,
        role,
        input_mask=input_mask,
        cache=cache,
        cache_index=index,
        last_only=True,
    )
    return logits[:, -1], cache

  def make_cache(batch: int, length: int) -> Cache:
    return init_cache(cfg, batch, length, per_layer=per_layer)

  def prepare_params(params: Params) -> Params:
    return to_per_layer_layout(params, cfg) if per_layer else params

  # A prefix shared by a batch is prefilled once (`Sampler.share_prefix`,
  # in multiples of 64 tokens) when no layer keeps a ring buffer: the rows'
  # suffixes are left-padded after it, and padding written into a sliding
  # window's ring would evict keys the row still sees.
  share = 64 if cfg.sliding_window == 0 else 0
  return SamplingFns(tokens_to_logits, make_cache, prepare_params, share)


def _stack_leaves(*leaves):
  if all(isinstance(x, np.ndarray) for x in leaves):
    return np.stack(leaves)  # host arrays stay on the host
  return jnp.stack(leaves)


def to_model_layout(params: Params, model_config) -> dict[str, Any]:
  """Turns a per-layer parameter tree into the model's own (stacked) layout.

  Loaders build the tree with one subtree per layer (`layer_0`, `layer_1`,
  ... next to `embedder`, `final_norm` and `heads`, named as in
  `spade.model.checkpoints`) and call this last; it returns the tree that
  `Transformer` takes: layer g * P + j becomes index g of `layers/block_j`
  (see the module docstring). numpy leaves are stacked with numpy (the result
  stays on the host), others with `jnp.stack`. A tree already in the model's
  layout (no `layer_i` keys) is returned as is.

  Raises:
    ValueError: the tree's layers are not exactly `config.model.num_layers`.
  """
  cfg = ModelConfig.from_config(model_config)
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
  cfg = ModelConfig.from_config(model_config)
  out = {k: v for k, v in params.items() if k not in STACKS}
  for name, first, groups, size in cfg.stacks():
    for j in range(size):
      block = params[name][f"block_{j}"]
      for g in range(groups):
        out[f"layer_{first + g * size + j}"] = jax.tree.map(
            lambda x, g=g: x[g], block
        )
  return out
