"""GGUF tensors mapped onto the model's per-layer parameter tree.

`gguf_params(path, config.model, kind)` reads a GGUF file of the kinds
"gemma3_gguf" and "qwen2_gguf" (found by `gguf_files.find_checkpoint_file`),
dequantizes every tensor with `gguf.quants.dequantize` and maps the
llama.cpp tensor names onto the tree that `spade.model.layout.to_model_layout`
takes:

  token_embd                    embedder/input_embedding        [V, E]
  blk.N.attn_norm               layer_N/pre_attention_norm      [E]
  blk.N.attn_q / attn_k / attn_v layer_N/attn/{q,k,v}_proj      [E, H, D]
  blk.N.attn_{q,k,v}.bias       layer_N/attn/{q,k,v}_proj/bias  [H, D]
  blk.N.attn_q_norm / k_norm    layer_N/attn/{q,k}_norm         [D]
  blk.N.attn_output             layer_N/attn/o_proj             [H, D, E]
  blk.N.post_attention_norm     layer_N/post_attention_norm     [E]
  blk.N.ffn_norm                layer_N/pre_ffw_norm            [E]
  blk.N.ffn_{gate,up,down}      layer_N/mlp/{gate,up,down}      [E, F] / [F, E]
  blk.N.post_ffw_norm           layer_N/post_ffw_norm           [E]
  output_norm                   final_norm                      [E]
  output (or token_embd)        heads/shared, or                [V, E]
                                heads/{designer,agent}
                                (`model.separate_heads`)

Norm weights go in as stored: llama.cpp already added Gemma's +1, and the
model's RMSNorm scale is the full multiplier. Each head starts as a copy of
the checkpoint's output layer (the input embedding when the checkpoint ties
them); the copies are separate buffers, from each other and from the input
embedding, so that a donating update never sees one buffer twice.
"""

from __future__ import annotations

import re
from typing import Any

import gguf
import numpy as np

from spade.model import gguf_files
from spade.model import placement
from spade.model import transformer

CheckpointFileError = gguf_files.CheckpointFileError

# GGUF `general.architecture` expected for each checkpoint kind.
ARCHITECTURES = {"gemma3_gguf": "gemma3", "qwen2_gguf": "qwen2"}

_LAYER_NAMES = {
    "attn_norm": ("pre_attention_norm", "scale"),
    "post_attention_norm": ("post_attention_norm", "scale"),
    "ffn_norm": ("pre_ffw_norm", "scale"),
    "post_ffw_norm": ("post_ffw_norm", "scale"),
    "attn_q_norm": ("attn", "q_norm", "scale"),
    "attn_k_norm": ("attn", "k_norm", "scale"),
    "ffn_gate": ("mlp", "gate", "kernel"),
    "ffn_up": ("mlp", "up", "kernel"),
    "ffn_down": ("mlp", "down", "kernel"),
    "attn_output": ("attn", "o_proj", "kernel"),
}

_PROJ = {"attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj"}

_BLOCK = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")


def dequantize(tensor) -> np.ndarray:
  """Returns a GGUF tensor as float32 numpy in row-major [out, in] order."""
  return np.asarray(
      gguf.quants.dequantize(tensor.data, tensor.tensor_type), np.float32
  )


def _model_value(model_config, key):
  return (
      model_config[key]
      if hasattr(model_config, "keys")
      else getattr(model_config, key)
  )


def check_config(reader, model_config, path: str, kind: str) -> None:
  """Raises `CheckpointFileError` when the file does not fit `model_config`.

  Compares the architecture and every size stored in the GGUF metadata with
  the config, naming the key to change.
  """
  arch = gguf_files.field(reader, "general.architecture")
  if arch != ARCHITECTURES[kind]:
    raise CheckpointFileError(
        f"Checkpoint file {path} holds architecture {arch!r}, but "
        f"config.checkpoint.kind={kind!r} expects {ARCHITECTURES[kind]!r}."
    )
  tensors = {t.name: t for t in reader.tensors}
  if "token_embd.weight" not in tensors:
    raise CheckpointFileError(f"Checkpoint file {path} has no token_embd.")
  vocab, width = (int(n) for n in reversed(tensors["token_embd.weight"].shape))
  q_out = int(tensors["blk.0.attn_q.weight"].shape[-1])
  kv_out = int(tensors["blk.0.attn_k.weight"].shape[-1])
  mlp = int(tensors["blk.0.ffn_gate.weight"].shape[-1])
  layers = int(gguf_files.field(reader, f"{arch}.block_count"))
  heads = int(gguf_files.field(reader, f"{arch}.attention.head_count"))
  kv_heads = int(gguf_files.field(reader, f"{arch}.attention.head_count_kv"))
  expected = {
      "vocab_size": vocab,
      "embed_dim": width,
      "num_layers": layers,
      "num_heads": heads,
      "num_kv_heads": kv_heads,
      "head_dim": q_out // heads,
      "mlp_dim": mlp,
  }
  if gguf_files.field(reader, f"{arch}.rope.scaling.type") == "linear":
    # llama.cpp writes Gemma 3 4B+'s linear scaling of the global layers.
    expected["rope_global_scale"] = float(
        gguf_files.field(reader, f"{arch}.rope.scaling.factor", 1.0)
    )
  for key, value in expected.items():
    have = _model_value(model_config, key)
    if have != value:
      raise CheckpointFileError(
          f"Checkpoint file {path} has {key}={value}, but config.model.{key}"
          f"={have}; use the config that matches the checkpoint."
      )
  if kv_out != kv_heads * (q_out // heads):
    raise CheckpointFileError(
        f"Checkpoint file {path}: attn_k has {kv_out} outputs, not "
        f"num_kv_heads * head_dim = {kv_heads * (q_out // heads)}."
    )


def gguf_params(path: str, model_config, kind: str) -> dict[str, Any]:
  """Reads a GGUF file into the model's parameter tree (numpy float32).

  Args:
    path: the GGUF file.
    model_config: `config.model` (sizes are checked against the file).
    kind: "gemma3_gguf" or "qwen2_gguf".

  Returns:
    The nested parameter dict of the contract, as float32 numpy arrays; each
    head (`transformer.head_names`) is an array of its own equal to the
    checkpoint's output layer.
  """
  reader = gguf_files.open_gguf(path)
  check_config(reader, model_config, path, kind)
  heads = int(_model_value(model_config, "num_heads"))
  kv_heads = int(_model_value(model_config, "num_kv_heads"))
  head_dim = int(_model_value(model_config, "head_dim"))
  embed = int(_model_value(model_config, "embed_dim"))
  params: dict[str, Any] = {}
  output = None
  for tensor in reader.tensors:
    try:
      value = dequantize(tensor)
    except Exception as e:  # a corrupt block surfaces as a numpy error
      raise CheckpointFileError(
          f"Checkpoint file {path}: tensor {tensor.name} "
          f"({tensor.tensor_type.name}) cannot be dequantized: {e}"
      ) from e
    name = tensor.name
    if name == "token_embd.weight":
      placement.set_leaf(params, ("embedder", "input_embedding"), value)
      continue
    if name == "output.weight":
      output = value
      continue
    if name == "output_norm.weight":
      placement.set_leaf(params, ("final_norm", "scale"), value)
      continue
    match = _BLOCK.match(name)
    if not match:
      continue  # e.g. rope_freqs: recomputed by the model from the config
    layer, base, suffix = int(match[1]), match[2], match[3]
    prefix = (f"layer_{layer}",)
    if base in _PROJ:
      n = heads if base == "attn_q" else kv_heads
      keys = prefix + ("attn", _PROJ[base])
      if suffix == "bias":
        placement.set_leaf(params, keys + ("bias",), value.reshape(n, head_dim))
      else:
        # [H*D, E] -> [E, H, D]; the rotate-half layout needs no permutation
        # because llama.cpp converts Gemma 3 and Qwen2 without one.
        placement.set_leaf(
            params, keys + ("kernel",), value.T.reshape(embed, n, head_dim)
        )
      continue
    if base not in _LAYER_NAMES or suffix != "weight":
      raise CheckpointFileError(
          f"Checkpoint file {path} has tensor {name}, which this loader does "
          "not know how to place."
      )
    keys = prefix + _LAYER_NAMES[base]
    if base == "attn_output":
      value = value.T.reshape(heads, head_dim, embed)  # [E, H*D] -> [H, D, E]
    elif base.startswith("ffn_"):
      value = np.ascontiguousarray(value.T)  # [out, in] -> [in, out]
    placement.set_leaf(params, keys, value)
  if output is None:  # tied: the heads start from the input embedding
    output = params["embedder"]["input_embedding"].copy()
  first, *rest = transformer.head_names(model_config)
  params["heads"] = {first: {"unembedding": output}}
  for name in rest:
    params["heads"][name] = {"unembedding": output.copy()}
  return params
