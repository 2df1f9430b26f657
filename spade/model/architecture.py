"""What a decoder is: `ModelConfig`, the remat policies and the published sizes.

`ModelConfig` is the hashable copy of `config.model` that every module of
`spade.model` reads; it knows the layer pattern (which layers are global,
their windows and RoPE bases) and how the layers group into the scanned
stacks (`STACKS`, see `spade.model.transformer`). `REMAT_POLICIES` names what
a layer keeps for the backward pass. `gemma3_shapes`, `qwen2_shapes` and
`qwen3_shapes` give the `config.model` values of the published models.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import ml_collections


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

# `config.model.decode_sharding`: how a one-token step (decoding) partitions
# its matmuls over the mesh. "fsdp": as training does, rows sharded over
# (data, fsdp) and each weight all-gathered over fsdp first, every step;
# "stationary": each weight stays on its shards and the rows move instead
# (gathered over fsdp before a projection, its partial sums reduce-scattered
# back after), so a step reads each chip's shard once. On one device both are
# the same program.
DECODE_SHARDINGS = ("stationary", "fsdp")

# `config.model.kernel_layout`: how a projection's kernel is stored. "in_out":
# [*in, *out] (`kernel`); "out_in": [*out, *in] (`kernel_t`, the layout of
# Hugging Face and GGUF files), which XLA's CPU backend streams faster in a
# matmul of a few rows (`spade.model.layers.TRANSPOSED`).
KERNEL_LAYOUTS = ("in_out", "out_in")

# `config.model.kv_cache_dtype`: "" keeps keys and values in
# `config.model.dtype`; "int8" stores them as int8 with one float32 scale
# per (row, KV head, position) (`spade.model.kv_cache.quantize`).
KV_CACHE_DTYPES = ("", "int8")

# `config.model.decode_mlp_kernel`: how a one-token step whose residual is
# kept in the decoding layout runs its MLP: "xla" as matmuls on the input
# XLA gathers; "pallas" as `spade.model.fused_mlp`'s kernel on a TPU mesh
# (XLA's matmuls elsewhere); "interpret" that kernel in Pallas' TPU
# interpreter on any backend (tests).
DECODE_MLP_KERNELS = ("xla", "pallas", "interpret")

# The two stacks of scanned layers (see the module docstring).
STACKS = ("layers", "tail")


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
  decode_sharding: str = "stationary"
  kernel_layout: str = "in_out"
  attention_chunk: int = 0
  separate_heads: bool = False
  kv_cache_dtype: str = ""
  decode_mlp_pad_rows: int = 0
  decode_mlp_kernel: str = "xla"

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
          " of spade.model.architecture.ModelConfig"
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
    decode = values.get("decode_sharding", "stationary")
    if decode not in DECODE_SHARDINGS:
      raise ValueError(
          f"config.model.decode_sharding={decode!r} is not one of"
          f" {DECODE_SHARDINGS}"
      )
    if values.get("kernel_layout", "in_out") not in KERNEL_LAYOUTS:
      raise ValueError(
          f"config.model.kernel_layout={values['kernel_layout']!r} is not one"
          f" of {KERNEL_LAYOUTS}"
      )
    if values.get("kv_cache_dtype", "") not in KV_CACHE_DTYPES:
      raise ValueError(
          f"config.model.kv_cache_dtype={values['kv_cache_dtype']!r} is not"
          f" one of {KV_CACHE_DTYPES}"
      )
    if values.get("decode_mlp_kernel", "xla") not in DECODE_MLP_KERNELS:
      raise ValueError(
          f"config.model.decode_mlp_kernel={values['decode_mlp_kernel']!r}"
          f" is not one of {DECODE_MLP_KERNELS}"
      )
    pad = values.get("decode_mlp_pad_rows", 0)
    if not isinstance(pad, int) or isinstance(pad, bool) or pad < 0:
      raise ValueError(
          f"config.model.decode_mlp_pad_rows={pad!r} must be an int >= 0"
          " (0: never pad; the tensor-axis pod configs use 128)"
      )
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


# Qwen2.5 (Coder) by size: layers, embed, heads, kv heads, MLP, tied output.
# Head width is embed / heads (64 and 128); RoPE base 1e6; 151,936 rows.
_QWEN2 = {
    "0.5b": (24, 896, 14, 2, 4864, True),
    "1.5b": (28, 1536, 12, 2, 8960, False),
}


def qwen2_shapes(name: str = "0.5b") -> dict[str, Any]:
  """`config.model` values for Qwen2.5 (Coder) "0.5b" or "1.5b".

  The 1.5B's output layer is its own (untied), as in its GGUF; the 0.5B
  ties it in the Hugging Face config, but its Coder GGUF carries an
  `output.weight` (the config sets `tie_embeddings=False` for it).
  """
  if name not in _QWEN2:
    raise ValueError(f"unknown Qwen2.5 size {name!r}; one of {sorted(_QWEN2)}")
  layers, embed, heads, kv_heads, mlp, tied = _QWEN2[name]
  return dict(
      family="qwen2",
      vocab_size=151_936,
      embed_dim=embed,
      num_layers=layers,
      num_heads=heads,
      num_kv_heads=kv_heads,
      head_dim=embed // heads,
      mlp_dim=mlp,
      sliding_window=0,
      global_every=1,
      rope_local_base=1_000_000.0,
      rope_global_base=1_000_000.0,
      rope_global_scale=1.0,
      query_scale=0.0,
      qk_norm=False,
      qkv_bias=True,
      mlp_activation="silu",
      tie_embeddings=tied,
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
