"""The decoder's layers: norm, RoPE, projections, attention, MLP, one block.

One set of layers covers Gemma 3 and Qwen2/Qwen3; `config.model` switches
the parts that differ (post norms, q/k norm, q/k/v biases, sliding-window
layers, the MLP activation).

Every parameter carries logical axis names ("layers", "vocab", "embed",
"heads", "kv_heads", "head_dim", "mlp"), listed once in `PARAM_AXES`;
activations are constrained with ("batch", "length", ...) names.
`spade.model.sharding` maps them onto a mesh with the rule table in
`config.mesh.rules`.

Precision: `config.model.dtype` is the activations' and the KV cache's type;
every matmul accumulates in float32 (`preferred_element_type`), and norms,
RoPE, the MLP's activation, softmax, logits and log-probs are float32.
`config.model.param_dtype` is the stored parameters' type.

Attention masks are computed from positions: a key is visible when its slot
is filled, its position is <= the query's and, on a sliding layer, query -
key < window (the cache itself is `spade.model.kv_cache`).
"""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
from jax.ad_checkpoint import checkpoint_name
import jax.numpy as jnp
import numpy as np

from spade.model import architecture
from spade.model import fused_mlp
from spade.model import kv_cache
from spade.model import mesh_fit

Array = jax.Array


# The mask value Gemma uses: finite, so a row with no visible key (a padding
# query) gives a uniform softmax instead of NaN.
_MASK_VALUE = -2.3819763e38

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
    # The output layers (`transformer.head_names`): one shared, or per role.
    ("shared", "unembedding"): ("vocab", "embed"),
    ("designer", "unembedding"): ("vocab", "embed"),
    ("agent", "unembedding"): ("vocab", "embed"),
}

# The decoding layout's tables (`transformer.sampling_fns`): split over the
# vocabulary on the mesh axes the rules give "decode_vocab" (fsdp and
# tensor by default), each row whole. A decode step's head then gives each
# chip whole logits for its share of the vocabulary, which the slot engine
# samples from where they lie (`sampler.sample_split`); a table split on
# "embed" gives float32 partial sums of every row's logits over the whole
# vocabulary instead, reduce-scattered after (on fsdp=4, 9 MiB a generated
# token of the Gemma 3 1B's 51 MiB minimum). The input lookup then takes
# whole rows of a table laid out by rows. The train state keeps PARAM_AXES.
DECODE_PARAM_AXES = {
    key: ("decode_vocab", None)
    for key, axes in PARAM_AXES.items()
    if axes == ("vocab", "embed")
}
# And the MLP's kernels split over its hidden width on the same axes
# ("decode_mlp"), Megatron's way: a step's rows, gathered whole, meet each
# chip's columns of gate and up, the hidden stays where they made it, and
# only down's output is summed across the mesh (float32 partial sums of
# [rows, embed], reduce-scattered to the rows). Split on "embed" (the
# train split) gate and up each gave float32 partial sums of [rows, mlp]
# instead, and the hidden went whole to every chip for down: on the Gemma 3
# 1B's every-slot step, 16 MiB a generated token of a 51 MiB minimum.
# Down's own names say how it meets that hidden: by default ("decode_down"
# as "decode_mlp", "decode_embed" whole) each chip sums its columns into
# float32 partial sums of [rows, embed], reduced across the whole mesh. The
# pod configs with a tensor axis (`config.tpu_pod_config`) give down the
# train split instead ("decode_down" -> tensor, "decode_embed" -> fsdp, and
# gate and up's hidden over tensor first): the hidden is gathered over fsdp
# (bf16 [rows, mlp / tensor]) and the partial sums are [rows, embed /
# fsdp], summed over tensor only. Per generated row that moves 2 mlp /
# tensor + 8 embed / fsdp bytes against 8 embed: on the Gemma 3 27B's
# (v5p-256) local layers, down's 10.9 MiB a step became 3.5.
DECODE_PARAM_AXES.update(
    {
        ("gate", "kernel"): (None, "decode_mlp"),
        ("up", "kernel"): (None, "decode_mlp"),
        ("down", "kernel"): ("decode_down", "decode_embed"),
    }
)
# And the key and value projections split over their KV heads as the cache
# keeps them ("cache_heads", `kv_cache.CACHE_AXES`), where those divide the
# mesh's axis: a chip makes its own heads' keys and values (float32 partial
# sums of [rows, its heads, head_dim], reduce-scattered to the rows) and
# writes them to its own part of the cache. Whole over tensor (the train
# split) every chip made every head's and dropped all but its own: on the
# Gemma 3 12B's every-slot step (v5p-128), ~7% of the bytes it read.
DECODE_PARAM_AXES.update(
    {
        (name, "kernel"): ("embed", "cache_heads", "head_dim")
        for name in ("k_proj", "v_proj")
    }
)
DECODE_PARAM_AXES.update(
    {
        (name, "bias"): ("cache_heads", "head_dim")
        for name in ("k_proj", "v_proj")
    }
)

# How many leading axes of each projection's kernel it contracts (its input
# dimensions; the rest are its features).
CONTRACTED = {
    "q_proj": 1,
    "k_proj": 1,
    "v_proj": 1,
    "o_proj": 2,
    "gate": 1,
    "up": 1,
    "down": 1,
}

# `config.model.kernel_layout="out_in"` stores each projection as
# `kernel_t`, its features first and its inputs last ([out, in], the layout
# of Hugging Face and GGUF files): XLA's CPU backend streams such a weight
# faster in a matmul of a few rows (one 1.5B-shaped MLP kernel alone at 4
# rows: 2.3-2.5 against 4.5-4.8 ms; a whole decode step of the 1.5B at 4
# and 8 rows: 1.12x and 1.19x, benchmarks/README.md).
TRANSPOSED = "kernel_t"
for _module, _c in CONTRACTED.items():
  _axes = PARAM_AXES[(_module, "kernel")]
  PARAM_AXES[(_module, TRANSPOSED)] = _axes[_c:] + _axes[:_c]
  if (_module, "kernel") in DECODE_PARAM_AXES:
    _axes = DECODE_PARAM_AXES[(_module, "kernel")]
    DECODE_PARAM_AXES[(_module, TRANSPOSED)] = _axes[_c:] + _axes[:_c]
del _module, _c, _axes


def out_in_axes(ndim: int, contracted: int, lead: int = 0) -> tuple:
  """The permutation that takes a kernel [*lead, *in, *out] (`contracted`
  in axes, `ndim` in all) to its `kernel_t` [*lead, *out, *in]."""
  ins = tuple(range(lead, lead + contracted))
  return tuple(range(lead)) + tuple(range(lead + contracted, ndim)) + ins


def to_out_in(kernel, contracted: int, lead: int = 0):
  """A kernel [*lead, *in, *out] (`contracted` in axes) as [*lead, *out, *in]
  (a transpose: a view for numpy arrays)."""
  return kernel.transpose(out_in_axes(np.ndim(kernel), contracted, lead))


def kernels_out_in(tree: dict, transpose=to_out_in) -> dict:
  """`tree` (nested dicts, stacked or per layer) with every projection's
  `kernel` [*in, *out] replaced by its `kernel_t` [*out, *in] (what
  `config.model.kernel_layout="out_in"` runs with).

  `transpose(leaf, contracted, lead)` makes the new leaf; leaves under a
  scanned stack (`architecture.STACKS`) lead with their layers axis.
  """

  def visit(node, path):
    out = {}
    for key, value in node.items():
      if isinstance(value, dict):
        out[key] = visit(value, path + (key,))
      elif key == "kernel" and path and path[-1] in CONTRACTED:
        lead = 1 if path[0] in architecture.STACKS else 0
        out[TRANSPOSED] = transpose(value, CONTRACTED[path[-1]], lead)
      else:
        out[key] = value
    return out

  return visit(dict(tree), ())


def constrain(x: Array, *axes: str | None) -> Array:
  return nn.with_logical_constraint(x, axes)


def stationary(cfg: architecture.ModelConfig, x: Array) -> bool:
  """Whether `x` ([batch, length, ...]) is a one-token step that moves its
  rows rather than the weights (`config.model.decode_sharding`)."""
  return cfg.decode_sharding == "stationary" and x.ndim >= 2 and x.shape[1] == 1


def _half_the_pad(cfg: architecture.ModelConfig, rows: int) -> bool:
  """At least half of `model.decode_mlp_pad_rows` rows: from there the MLP
  runs on a multiple of it (`padded_rows`), and the residual is kept in
  the decoding layout (`residual_kept`)."""
  return 2 * rows >= cfg.decode_mlp_pad_rows


def residual_kept(cfg: architecture.ModelConfig, x: Array) -> bool:
  """Whether a step on x [rows, ...] keeps its residual stream in the
  decoding layout (`residual`): a one-token step under rules that name
  "decode_residual", with at least half of `model.decode_mlp_pad_rows`
  rows (the MLP then runs on a multiple of it, `padded_rows`) or with the
  MLP as `fused_mlp`'s kernel, whose input XLA does not gather."""
  return (
      stationary(cfg, x)
      and mesh_fit.mesh_axes("decode_residual") is not None
      and (_half_the_pad(cfg, x.shape[0]) or fused_mlp.fused(cfg, x))
  )


def residual(cfg: architecture.ModelConfig, x: Array) -> Array:
  """x [batch, length, embed], the residual stream between the layers,
  where they keep it: rows over "batch", the width whole, as training
  does; in a one-token step that `residual_kept` (the tensor-axis pod
  configs' rules: "decode_residual" -> fsdp) its rows whole on every fsdp
  shard ("decode_batch") and its width split there. That is where the
  query, key and value projections (their input width split over fsdp)
  take it and where the attention's output and down (their output width
  split there) leave it, so no layer moves its rows to the residual's
  layout and back, an all-to-all and a relayout each time: the Gemma 3
  12B's every-slot step (v5p-128, 6 layers) 1.41 -> 1.36 of its minimum,
  192 rows 1.46 -> 1.41. Under half of the pad's multiple the MLP's input,
  gathered over the width's shards (3,840 / 16: 240, not a multiple of the
  TPU's 128 lanes), is laid out again every layer, and the training
  layout reads less (16 rows 1.21 against 1.44), hence the threshold;
  with the MLP as `fused_mlp`'s kernel XLA gathers no input, and the
  residual is kept at every count (6 layers, 32 rows: 1.31 -> 1.18)."""
  if residual_kept(cfg, x):
    return constrain(x, "decode_batch", "length", "decode_residual")
  return constrain(x, "batch", "length", "embed")


def padded_rows(cfg: architecture.ModelConfig, fn, x: Array):
  """fn(x) for a one-token step's x [rows, ...], its rows padded with zeros
  up to a multiple of `m = config.model.decode_mlp_pad_rows` (each shard's
  at its end, so none moves) when there are at least m / 2 and not a
  multiple of m, and the MLP's input gathers them (the mesh splits them,
  or the step keeps its residual in the decoding layout, `residual`); the
  pad sliced off fn's output.

  Why (the Gemma 3 12B's gathered calls on v5p-128, 6 layers): under a
  tensor-axis pod config's rules the MLP's input is gathered over its
  embedding's fsdp shards, and the TPU compiler lays that matmul operand
  out with its rows on the vector lanes (128). At 256 or 128 rows the
  gather lands in that layout; at 192 or 96 it lands shard by shard and a
  copy and a reshape a layer lay it out again. Run on 256 (or 128) rows
  the MLP has neither: 192 rows' HBM ratio 1.58 -> 1.46, 96 rows' 1.48 ->
  1.36, 64 rows' 1.43 -> 1.40. Under 64 the compiler picks another layout
  and the pad only adds bytes (48 rows' 1.38 -> 1.42, 32 rows' 1.31 ->
  1.44, 16 rows' 1.21 -> 1.47), hence at least m / 2 only."""
  m = cfg.decode_mlp_pad_rows
  r = x.shape[0]
  if not m or not stationary(cfg, x) or r % m == 0 or not _half_the_pad(cfg, r):
    return fn(x)
  kept = residual_kept(cfg, x)
  # The rows' shards where the MLP's input comes from: the residual's
  # (`residual`: "decode_batch" when the rules keep it there, its rows then
  # gathered whatever their shards; else "batch", whose rows the gather
  # moves only when the mesh splits them).
  shards = kv_cache.row_shards("decode_batch" if kept else "batch")
  full = -(-r // m) * m
  if (shards <= 1 and not kept) or r % shards or full % shards:
    return fn(x)
  per, full_per = r // shards, full // shards
  xs = x.reshape((shards, per) + x.shape[1:])
  pad = [(0, 0), (0, full_per - per)] + [(0, 0)] * (x.ndim - 1)
  y = fn(jnp.pad(xs, pad).reshape((full,) + x.shape[1:]))
  y = y.reshape((shards, full_per) + y.shape[1:])[:, :per]
  return y.reshape((r,) + y.shape[2:])


def fit_sharding(leaf, sharding):
  """`sharding` with the mesh axes dropped from each dimension of `leaf`
  they do not divide evenly (that dimension whole)."""
  spec = list(sharding.spec) + [None] * (np.ndim(leaf) - len(sharding.spec))
  ok = mesh_fit.divides(sharding.mesh, np.shape(leaf), spec)
  spec = [entry if fits else None for entry, fits in zip(spec, ok)]
  return jax.sharding.NamedSharding(
      sharding.mesh, jax.sharding.PartitionSpec(*spec)
  )


def decode_fits(key: tuple[str, str], shape, mesh=None, rules=None) -> bool:
  """Whether the mesh axes `rules` give `DECODE_PARAM_AXES[key]` divide
  each dimension of `shape` they split (by default the mesh and rules the
  trace runs under; no mesh: True, every constraint being a no-op). Where
  they do not, the parameter keeps the train state's split in the decoding
  layout (`transformer.fitted_shardings`), and `Linear` reads it so."""
  if mesh is None:
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
      return True
  if rules is None:
    rules = nn.get_logical_axis_rules()
  spec = nn.logical_to_mesh_axes(DECODE_PARAM_AXES[key], rules)
  return all(mesh_fit.divides(mesh, shape, spec))


def decode_logits(x: Array) -> Array:
  """A decode step's logits [B, ..., V] where the decoding layout's table
  (`DECODE_PARAM_AXES`) gives them: rows over "decode_batch", the
  vocabulary over "decode_vocab". The slot engine draws from them there
  (`sampler.sample_split`); other readers constrain them to the rows."""
  return constrain(x, "decode_batch", *(None,) * (x.ndim - 2), "decode_vocab")


def rows_to_weights(x: Array, contracted: tuple[str, ...]) -> Array:
  """x[batch, ..., *contracted] laid out like the weight it meets: rows over
  "decode_batch" only (the mesh's data axis), so they are whole on every
  fsdp shard, and the contracted dimensions split as the weight's are. Its
  matmul with the weight's own shard then gives partial sums."""
  lead = ("decode_batch",) + (None,) * (x.ndim - len(contracted) - 1)
  return constrain(x, *lead, *contracted)


def rows_back(y: Array, features: tuple[str, ...], kept: bool = False) -> Array:
  """A matmul's output back to the activations' layout, rows over "batch":
  a reduce-scatter of the partial sums when the weight was split on what
  it contracts; when it is split on an output dimension ("embed": the
  fsdp axis in the default rules), the output is first pinned to that
  split, so its rows move (an all-to-all) rather than the weight. `kept`
  (`residual_kept`): the residual stream is kept in that split, and the
  output stays there."""
  rest = (None,) * (y.ndim - len(features) - 1)
  if "decode_mlp" in features:
    # Split on the decoding layout's hidden (gate and up): the output stays
    # where it was made, for down to contract.
    return constrain(y, "decode_batch", *rest, *features)
  if "embed" in features or (
      "decode_embed" in features
      and mesh_fit.mesh_axes("decode_embed") is not None
  ):
    y = constrain(y, "decode_batch", *rest, *features)
    if kept:
      return y
  return constrain(y, "batch", *rest, *features)


def logical_init(init: Callable[..., Array], module: str, name: str):
  return nn.with_logical_partitioning(init, PARAM_AXES[(module, name)])


# The variable collection of low-rank adapters (`spade.train.lora`): a
# module with {"a": A[*in, r], "b": B[r, *out]} in it adds u - sg(u), with
# u = sg(x)·A·B, to its output (B already holds the adapters' scale). The
# kernels are the merged weights the model runs with, so the value is
# theirs exactly and so is the gradient to x (sg(x): the kernel already
# holds A·B), while the gradient reaches A and B without the kernel's own
# gradient (x^T·dy, as costly as the forward matmul) ever being formed.
LORA = "lora"


class RMSNorm(nn.Module):
  """y = x * rsqrt(mean(x^2) + eps) * scale; `scale` is the full multiplier."""

  eps: float
  param_dtype: Any
  axes_key: str = "final_norm"

  @nn.compact
  def __call__(self, x: Array) -> Array:
    scale = self.param(
        "scale",
        logical_init(nn.initializers.ones, self.axes_key, "scale"),
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
  cfg: architecture.ModelConfig

  @nn.compact
  def __call__(self, x: Array) -> Array:
    c, f = self.contract, len(self.features)
    pdt = jnp.dtype(self.cfg.param_dtype)
    ins = tuple(x.shape[x.ndim - c :])
    if self.cfg.kernel_layout == "out_in":
      name, shape = TRANSPOSED, tuple(self.features) + ins
      init = nn.initializers.lecun_normal(
          in_axis=tuple(range(f, f + c)), out_axis=tuple(range(f))
      )
      contracted = tuple(range(f, f + c))
    else:
      name, shape = "kernel", ins + tuple(self.features)
      init = nn.initializers.lecun_normal(
          in_axis=tuple(range(c)), out_axis=tuple(range(c, c + f))
      )
      contracted = tuple(range(c))
    kernel = self.param(name, logical_init(init, self.name, name), shape, pdt)
    dtype = jnp.dtype(self.cfg.dtype)
    move_rows = stationary(self.cfg, x)
    kept = residual_kept(self.cfg, x)
    axes = PARAM_AXES[(self.name, "kernel")]  # [*in, *features] either way
    if (
        move_rows
        and not self.cfg.scan_decode
        and (self.name, name) in DECODE_PARAM_AXES
        and decode_fits((self.name, name), shape)
    ):
      # The decoding layout's split (`DECODE_PARAM_AXES`), which the
      # per-layer tree a one-token step runs on holds.
      axes = DECODE_PARAM_AXES[(self.name, "kernel")]
    if move_rows:
      # The step's one position dropped: [rows, *in] (a length axis of 1
      # between the rows and the widths let XLA tile the gathered hidden
      # [rows, 1, mlp / tensor] 16 times over its size).
      x = rows_to_weights(x[:, 0], axes[:c])
    # Float32 accumulation whatever the activations' type; one rounding to
    # `dtype` at the end.
    y = jax.lax.dot_general(
        x.astype(dtype),
        kernel.astype(dtype),
        ((tuple(range(x.ndim - c, x.ndim)), contracted), ((), ())),
        preferred_element_type=jnp.float32,
    )
    if move_rows:
      y = rows_back(y, axes[c:], kept)
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
      y = y + gradient_only(delta)
    if self.use_bias:
      bias = self.param(
          "bias",
          logical_init(nn.initializers.zeros, self.name, "bias"),
          tuple(self.features),
          pdt,
      )
      y = y + bias.astype(jnp.float32)
    if move_rows:
      y = y[:, None]
    return y.astype(dtype)


def gradient_only(delta: Array) -> Array:
  """Zero, with the gradient of `delta` (an adapter's term, see `LORA`)."""
  return delta - jax.lax.stop_gradient(delta)


def _proj(
    name: str,
    features,
    contract: int,
    cfg: architecture.ModelConfig,
    use_bias=False,
) -> Linear:
  if isinstance(features, int):
    features = (features,)
  return Linear(tuple(features), contract, use_bias, cfg, name=name)


class Attention(nn.Module):
  """GQA with optional q/k norm and q/k/v biases, RoPE, sliding window.

  Attributes:
    cfg: the model config.
    is_global: attend over the whole sequence (else over the sliding window),
      with the global RoPE base (else the local one).
  """

  cfg: architecture.ModelConfig
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
    q = constrain(q, "batch", "length", "heads", "head_dim")
    # A one-token step's keys and values stay on the heads their projection
    # made them on (its decoding layout splits them as the cache does).
    kv_axes = ("batch", "length", "kv_heads", "head_dim")
    if stationary(cfg, x):
      kv_axes = kv_cache.fitted_axes(
          k.shape, ("batch", "length", "cache_heads", "head_dim")
      )
    k = constrain(k, *kv_axes)
    v = constrain(v, *kv_axes)
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
    # Attention runs on [batch, kv_heads, ...] operands: the cache is stored
    # in exactly that shape, so the decode step's in-place cache update feeds
    # the attention matmuls without a reshape (a reshape there made XLA copy
    # the whole cache every step). The KV heads are split over tensor as the
    # cache's are (`kv_cache.CACHE_AXES`), the query heads of each with them.
    qf = q.reshape(b, length, kv, g, h).transpose(0, 2, 3, 1, 4)
    qf = _heads_split(qf.reshape(b, kv, g * length, h))
    kf = _heads_split(k.transpose(0, 2, 1, 3))
    vf = _heads_split(v.transpose(0, 2, 1, 3))

    def scores(keys, kpos, key_scale):
      logits = jnp.einsum(
          "bkqh,bksh->bkqs",
          qf,
          keys.astype(dtype),
          preferred_element_type=jnp.float32,
      )
      if key_scale is not None:  # an int8 cache: q . (s k) = s (q . k)
        logits = logits * key_scale[:, :, None, :]
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
      return logits.reshape((b, kv, g * length, -1))

    new_cache = None
    chunk = cfg.attention_chunk
    if cache is None and 0 < chunk < length and length % chunk == 0:
      out = _chunked_attention(
          qf.reshape(b, kv, g, length, h), kf, vf, positions, key_pos,
          window, chunk, dtype,
      )  # fmt: skip
      return self._out(out, b, kv, g, length, n, h, cfg), None
    # (keys, values, their positions, and an int8 cache's scales or None)
    scales = lambda c: (c.get("k_scale"), c.get("v_scale"))
    if cache is None:
      parts = [(kf, vf, key_pos, None, None)]
    elif length == 1 or window == 0:
      # Write, then attend over the updated cache: a one-token step only
      # overwrites a slot that has left the window, and a global buffer never
      # wraps. (Reading the old buffer and then updating it makes XLA copy
      # the cache every step.)
      new_cache = kv_cache.write(cache, index, kf, vf, key_pos, cache_index)
      layer = kv_cache.layer_view(new_cache, index)
      # Fewer rows than the cache's: each shard's first rows, read in place
      # (the slot engine's gathered calls on a prefix of the rows).
      layer = kv_cache.row_prefix(layer, b)
      parts = [(layer["k"], layer["v"], layer["pos"], *scales(layer))]
    else:
      # A chunk on a ring buffer can overwrite keys its own earlier queries
      # still need: attend over the old cache plus the chunk, then write.
      layer = kv_cache.layer_view(cache, index)
      fresh = (kf, vf, key_pos, None, None)
      if "k_scale" in layer:
        # An int8 cache: the chunk's own keys and values are read as the
        # cache will hold them, so what a query sees does not depend on
        # how the prompt was cut into chunks.
        (k8, k_scale), (v8, v_scale) = map(kv_cache.quantize, (kf, vf))
        fresh = (k8, v8, key_pos, k_scale, v_scale)
      parts = [(layer["k"], layer["v"], layer["pos"], *scales(layer)), fresh]
      new_cache = kv_cache.write(cache, index, kf, vf, key_pos, cache_index)
    logits = jnp.concatenate(
        [scores(kk, pp, ks) for kk, _, pp, ks, _ in parts], -1
    )
    probs = jax.nn.softmax(logits, axis=-1)
    out, offset = 0.0, 0
    for kk, vv, _, _, value_scale in parts:
      size = kk.shape[2]
      p = probs[..., offset : offset + size]
      if value_scale is not None:  # sum_s p_s (s_s v_s) = sum_s (p_s s_s) v_s
        p = p * value_scale[:, :, None, :]
      p = p.astype(dtype)
      out = out + jnp.einsum(
          "bkqs,bksh->bkqh",
          p,
          vv.astype(dtype),
          preferred_element_type=jnp.float32,
      )
      offset += size
    return self._out(out, b, kv, g, length, n, h, cfg), new_cache

  def _out(self, out, b, kv, g, length, n, h, cfg):
    """[b, kv, g * length, h] attention output -> the output projection."""
    out = out.astype(jnp.dtype(cfg.dtype)).reshape(b, kv, g, length, h)
    out = out.transpose(0, 3, 1, 2, 4).reshape(b, length, n, h)
    out = constrain(out, "batch", "length", "heads", "head_dim")
    out = checkpoint_name(out, "context")
    y = _proj("o_proj", cfg.embed_dim, 2, cfg)(out)
    return checkpoint_name(y, "out_proj")


def _heads_split(x: Array) -> Array:
  """x [batch, kv_heads, ...] with its KV heads where the cache keeps them
  (`kv_cache.CACHE_AXES`), when they divide the tensor axis; else as is."""
  axes = ("batch", "cache_heads") + (None,) * (x.ndim - 2)
  if kv_cache.fitted_axes(x.shape, axes)[1] is None:
    return x
  return constrain(x, *axes)


def _chunked_attention(q, k, v, positions, key_pos, window, chunk, dtype):
  """Attention of `chunk` queries at a time against every key (no cache).

  q: [b, kv, g, L, h] (g query heads per kv head); k, v: [b, kv, L, h];
  positions, key_pos: [b, L]. Returns [b, kv, g * L, h] float32.
  Each query's softmax runs over all keys at once, so the result is the
  one-block attention's; each block is rematerialised, so a backward pass
  keeps [chunk, L] scores alive instead of [L, L].
  """
  b, kv, g, length, h = q.shape
  n = length // chunk

  @jax.checkpoint
  def block(args):
    qc, qp = args
    logits = jnp.einsum(
        "bkgqh,bksh->bkgqs", qc, k.astype(dtype),
        preferred_element_type=jnp.float32,
    )  # fmt: skip
    qp, kp = qp[:, :, None], key_pos[:, None, :]
    visible = (kp >= 0) & (kp <= qp)
    if window:
      visible &= qp - kp < window
    bias = jnp.where(visible, 0.0, _MASK_VALUE).astype(logits.dtype)
    probs = jax.nn.softmax(logits + bias[:, None, None], axis=-1)
    return jnp.einsum(
        "bkgqs,bksh->bkgqh", probs.astype(dtype), v.astype(dtype),
        preferred_element_type=jnp.float32,
    )  # fmt: skip

  qs = q.reshape(b, kv, g, n, chunk, h).transpose(3, 0, 1, 2, 4, 5)
  ps = positions.reshape(b, n, chunk).transpose(1, 0, 2)
  out = jax.lax.map(block, (qs, ps))  # [n, b, kv, g, chunk, h]
  return out.transpose(1, 2, 3, 0, 4, 5).reshape(b, kv, g * length, h)


class MLP(nn.Module):
  """down(act(gate(x)) * up(x)): GeGLU ("gelu") or SwiGLU ("silu")."""

  cfg: architecture.ModelConfig

  @nn.compact
  def __call__(self, x: Array) -> Array:
    cfg = self.cfg
    gate_proj = _proj("gate", cfg.mlp_dim, 1, cfg)
    up_proj = _proj("up", cfg.mlp_dim, 1, cfg)
    down_proj = _proj("down", cfg.embed_dim, 1, cfg)

    def body(x):
      return self._body(x, gate_proj, up_proj, down_proj)

    return padded_rows(cfg, body, x)

  def _body(self, x, gate_proj, up_proj, down_proj):
    cfg = self.cfg
    if self._fused(x):
      # One Pallas kernel that gathers its input and hidden into VMEM
      # (`fused_mlp`).
      kernel = lambda proj: proj.variables["params"]["kernel"]
      y = fused_mlp.mlp(
          cfg,
          constrain(x[:, 0], "decode_batch", "decode_residual"),
          kernel(gate_proj),
          kernel(up_proj),
          kernel(down_proj),
      )
      return checkpoint_name(y[:, None], "mlpwo")
    gate = checkpoint_name(gate_proj(x), "mlpwi")
    up = checkpoint_name(up_proj(x), "mlpwi")
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
    if not stationary(cfg, x):
      # (A one-token step leaves it where gate and up made it: `Linear`.)
      hidden = constrain(hidden, "batch", "length", "mlp")
    y = down_proj(hidden)
    return checkpoint_name(y, "mlpwo")

  def _fused(self, x) -> bool:
    """Whether the MLP runs as `fused_mlp`'s kernel: in a one-token step
    that keeps its residual in the decoding layout, where the kernel can
    run, on the decoding layout's kernels (`decode_fits`); its adapters'
    term (`LORA`) is zero in value, and the step takes no gradient."""
    cfg = self.cfg
    shape = (cfg.embed_dim, cfg.mlp_dim)
    return (
        not cfg.scan_decode
        and not self.is_initializing()
        and residual_kept(cfg, x)
        and fused_mlp.fused(cfg, x)
        and decode_fits(("gate", "kernel"), shape)
        and decode_fits(("up", "kernel"), shape)
        and decode_fits(("down", "kernel"), shape[::-1])
    )


class Block(nn.Module):
  """One decoder layer; post norms only for the Gemma family."""

  cfg: architecture.ModelConfig
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
    x = residual(cfg, x + y)
    y = MLP(cfg, name="mlp")(norm("pre_ffw_norm")(x))
    if gemma:
      y = norm("post_ffw_norm")(y)
    x = residual(cfg, x + y)
    return x, new_cache
