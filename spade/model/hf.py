"""Hugging Face safetensors checkpoints of Gemma 3, Qwen2/Qwen2.5 and Qwen3.

`hf_params(path, config.model)` reads a Hugging Face model directory
(`config.json` plus `model.safetensors`, or shards listed by
`model.safetensors.index.json`) of Gemma 3 (`Gemma3ForCausalLM`, or the text
part of `Gemma3ForConditionalGeneration`), Qwen2 / Qwen2.5 or Qwen3 (dense)
into the model's parameters. Names map as

  embed_tokens                      embedder/input_embedding   [V, E]
  layers.N.input_layernorm          layer_N/pre_attention_norm [E]
  layers.N.self_attn.{q,k,v}_proj   layer_N/attn/{q,k,v}_proj  [E, H, D]
  layers.N.self_attn.o_proj         layer_N/attn/o_proj        [H, D, E]
  layers.N.self_attn.{q,k}_norm     layer_N/attn/{q,k}_norm    [D]
  layers.N.post_attention_layernorm Gemma: post_attention_norm; Qwen:
                                    pre_ffw_norm (Qwen has no post norms)
  layers.N.pre_feedforward_layernorm  layer_N/pre_ffw_norm     [E]
  layers.N.post_feedforward_layernorm layer_N/post_ffw_norm    [E]
  layers.N.mlp.{gate,up,down}_proj  layer_N/mlp/{gate,up,down} [E, F] / [F, E]
  norm                              final_norm                 [E]
  lm_head (or embed_tokens)         heads/shared, or           [V, E]
                                    heads/{designer,agent}
                                    (`model.separate_heads`)

Gemma's RMSNorm multiplies by (1 + w) and stores w; the model's RMSNorm scale
is the full multiplier, so Gemma norms (q/k norms included) go in as w + 1
(llama.cpp's GGUF files store them already shifted). Qwen stores the full
multiplier. Hugging Face keeps rotate-half RoPE, as the model does, so no
q/k permutation is needed. The model config is derived from `config.json`
and compared with `config.model`; a mismatch names every differing key.

Tensors are read one at a time from memory-mapped files and placed on the
mesh as they are read (`spade.model.placement`). The files are parsed here
(`read_safetensors`) rather than with `safetensors.safe_open`, whose numpy
reader cannot return bfloat16 tensors (the dtype of real checkpoints).
`hf_vocabulary` reads the directory's tokenizer.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import re
import struct
from typing import Any

import ml_dtypes
import numpy as np

from spade.model import architecture
from spade.model import gguf_files
from spade.model import placement

CheckpointFileError = gguf_files.CheckpointFileError

_SAFETENSORS_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
}

# Hugging Face `model_type` -> our `config.model.family`.
_FAMILIES = {"gemma3_text": "gemma3", "qwen2": "qwen2", "qwen3": "qwen3"}

# transformers' defaults for the keys read here, for configs that leave them
# out (the text_config of Gemma 3 4B-27B lists only what differs).
_HF_DEFAULTS = {
    "gemma3_text": dict(
        vocab_size=262_208,
        hidden_size=2304,
        intermediate_size=9216,
        num_hidden_layers=26,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=256,
        hidden_activation="gelu_pytorch_tanh",
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        attention_bias=False,
        query_pre_attn_scalar=256,
        sliding_window=4096,
        sliding_window_pattern=6,
        rope_theta=1_000_000.0,
        rope_local_base_freq=10_000.0,
    ),
    "qwen2": dict(
        vocab_size=151_936,
        hidden_size=4096,
        intermediate_size=22016,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        hidden_act="silu",
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_theta=10_000.0,
        use_sliding_window=False,
    ),
    "qwen3": dict(
        vocab_size=151_936,
        hidden_size=4096,
        intermediate_size=22016,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        head_dim=128,
        hidden_act="silu",
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        attention_bias=False,
        rope_theta=10_000.0,
        use_sliding_window=False,
    ),
}

# Weights of a multimodal checkpoint that the text model does not use.
_SKIP_PREFIXES = (
    "vision_tower.",
    "multi_modal_projector.",
    "model.vision_tower.",
    "model.multi_modal_projector.",
)

# Prefixes of the text decoder's weights, longest first.
_TEXT_PREFIXES = ("model.language_model.", "language_model.model.", "model.")

_LM_HEAD = ("lm_head.weight", "language_model.lm_head.weight")

_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")


def read_safetensors(path: str) -> dict[str, np.ndarray]:
  """Memory-maps one .safetensors file: name -> read-only array (no copy)."""
  try:
    size = os.path.getsize(path)
    with open(path, "rb") as f:
      (header_len,) = struct.unpack("<Q", f.read(8))
      if header_len > size - 8:
        raise ValueError(f"header of {header_len} bytes in a {size}-byte file")
      header = json.loads(f.read(header_len))
  except (OSError, ValueError, struct.error) as e:
    raise CheckpointFileError(
        f"{path} is not a readable safetensors file ({e}); download it again."
    ) from e
  start = 8 + header_len
  data = (
      np.memmap(path, np.uint8, "r", offset=start)
      if size > start
      else np.zeros(0, np.uint8)
  )
  tensors = {}
  for name, info in header.items():
    if name == "__metadata__":
      continue
    if info["dtype"] not in _SAFETENSORS_DTYPES:
      raise CheckpointFileError(
          f"{path}: tensor {name} has dtype {info['dtype']}; only "
          f"{sorted(_SAFETENSORS_DTYPES)} are floating-point weights read here."
      )
    lo, hi = info["data_offsets"]
    if hi > data.size:
      raise CheckpointFileError(
          f"{path}: tensor {name} ends at byte {start + hi} but the file has "
          f"{size} bytes; the file is truncated, download it again."
      )
    dtype = np.dtype(_SAFETENSORS_DTYPES[info["dtype"]])
    tensors[name] = data[lo:hi].view(dtype).reshape(info["shape"])
  return tensors


def _weight_files(path: str) -> list[str]:
  index = os.path.join(path, "model.safetensors.index.json")
  if os.path.exists(index):
    with open(index) as f:
      weight_map = json.load(f)["weight_map"]
    files = sorted(set(weight_map.values()))
    return [os.path.join(path, name) for name in files]
  files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
  if not files:
    raise CheckpointFileError(
        f"{path} holds no *.safetensors file; point "
        "--config.checkpoint.path at a Hugging Face model directory "
        "(config.json + model.safetensors)."
    )
  return files


def read_hf_config(path: str) -> dict[str, Any]:
  """The text model's Hugging Face config, with transformers' defaults filled.

  For `Gemma3ForConditionalGeneration` this is its `text_config` (the tied
  flag is taken from the outer config when only it sets it).
  """
  file = os.path.join(path, "config.json")
  if not os.path.exists(file):
    raise CheckpointFileError(
        f"{path} has no config.json; --config.checkpoint.path must be a "
        "Hugging Face model directory."
    )
  with open(file) as f:
    outer = json.load(f)
  try:
    return text_config(outer)
  except ValueError as e:
    raise CheckpointFileError(f"{file}: {e}") from e


def text_config(outer: dict[str, Any]) -> dict[str, Any]:
  """`read_hf_config` for a config.json already parsed."""
  hf = dict(outer)
  if outer.get("model_type") == "gemma3" or "text_config" in outer:
    hf = dict(outer.get("text_config") or {})
    hf.setdefault("model_type", "gemma3_text")
    if "tie_word_embeddings" in outer:
      hf.setdefault("tie_word_embeddings", outer["tie_word_embeddings"])
  model_type = hf.get("model_type")
  if model_type not in _FAMILIES:
    raise CheckpointFileError(
        f"model_type {model_type!r} is not one of {sorted(_FAMILIES)} (or"
        " gemma3 with a text_config)."
    )
  return {**_HF_DEFAULTS[model_type], **hf}


def _rope(hf: dict[str, Any], layer_type: str) -> tuple[float, dict]:
  """(theta, the rest of the rope parameters) for one attention type."""
  params = hf.get("rope_parameters")
  if isinstance(params, dict) and layer_type in params:
    params = params[layer_type]
  if not isinstance(params, dict) or params.get("rope_theta") is None:
    # transformers < 5: rope_theta / rope_local_base_freq / rope_scaling.
    scaling = hf.get("rope_scaling") if layer_type == "full_attention" else None
    theta = (
        hf["rope_local_base_freq"]
        if layer_type == "sliding_attention"
        else hf["rope_theta"]
    )
    return float(theta), dict(scaling or {})
  return float(params["rope_theta"]), {
      k: v for k, v in params.items() if k != "rope_theta"
  }


def model_config_from_hf(hf: dict[str, Any], path: str = "") -> dict[str, Any]:
  """`config.model` values that describe a Hugging Face text config.

  Args:
    hf: from `read_hf_config`.
    path: the directory, for error messages.

  Raises:
    CheckpointFileError: the checkpoint uses something the model does not
      implement (RoPE scaling other than linear on the global layers,
      logit soft-capping, Qwen sliding windows, an unexpected activation).
  """
  model_type = hf["model_type"]
  family = _FAMILIES[model_type]
  layers = int(hf["num_hidden_layers"])
  heads = int(hf["num_attention_heads"])
  embed = int(hf["hidden_size"])
  head_dim = int(hf.get("head_dim") or embed // heads)
  layer_types = hf.get("layer_types")
  unsupported = []
  if family == "gemma3":
    if not layer_types:
      pattern = int(hf.get("sliding_window_pattern", 6))
      layer_types = [
          "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
          for i in range(layers)
      ]
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
      if hf.get(key) is not None:
        unsupported.append(f"{key}={hf[key]}")
  elif hf.get("use_sliding_window"):
    unsupported.append("use_sliding_window=true")
  layer_types = list(layer_types or ["full_attention"] * layers)
  globals_ = [i for i, t in enumerate(layer_types) if t == "full_attention"]
  sliding = len(globals_) < layers
  local_base, local_rest = (
      _rope(hf, "sliding_attention")
      if sliding
      else (
          0.0,
          {},
      )
  )
  global_base, global_rest = _rope(hf, "full_attention")
  global_scale = 1.0
  if global_rest.get("rope_type") == "linear":  # Gemma 3 4B and up: 8
    global_scale = float(global_rest["factor"])
    global_rest = {}
  for name, rest in (("full", global_rest), ("sliding", local_rest)):
    if rest.get("rope_type", "default") != "default":
      unsupported.append(f"{name} attention rope {rest}")
  activation = hf.get("hidden_activation") or hf.get("hidden_act")
  expected_act = "gelu_pytorch_tanh" if family == "gemma3" else "silu"
  if activation != expected_act:
    unsupported.append(f"activation {activation!r}")
  if unsupported:
    raise CheckpointFileError(
        f"Checkpoint {path} uses {', '.join(unsupported)}, which "
        "spade.model.transformer does not implement."
    )
  values = dict(
      family=family,
      vocab_size=int(hf["vocab_size"]),
      embed_dim=embed,
      num_layers=layers,
      num_heads=heads,
      num_kv_heads=int(hf["num_key_value_heads"]),
      head_dim=head_dim,
      mlp_dim=int(hf["intermediate_size"]),
      sliding_window=int(hf["sliding_window"]) if sliding else 0,
      global_every=(globals_[0] + 1 if globals_ else layers + 1)
      if sliding
      else 1,
      rope_local_base=local_base if sliding else global_base,
      rope_global_base=global_base,
      rope_global_scale=global_scale,
      query_scale=float(hf["query_pre_attn_scalar"])
      if family == "gemma3"
      else 0.0,
      qk_norm=family in ("gemma3", "qwen3"),
      qkv_bias=True if family == "qwen2" else bool(hf["attention_bias"]),
      mlp_activation="gelu" if family == "gemma3" else "silu",
      tie_embeddings=bool(hf["tie_word_embeddings"]),
      scale_embeddings=family == "gemma3",
      norm_eps=float(hf["rms_norm_eps"]),
  )
  values["_layer_is_global"] = [t == "full_attention" for t in layer_types]
  return values


def check_model_config(derived: dict[str, Any], model_config, path: str):
  """Raises `CheckpointFileError` naming every key where the two differ.

  Compares what changes the computation: for a model without sliding
  windows the local RoPE base and `global_every` do not matter, and the
  query scale is compared as the multiplier it gives.
  """
  cfg = architecture.ModelConfig.from_config(model_config)
  have = dataclasses.asdict(cfg)
  want = {k: v for k, v in derived.items() if not k.startswith("_")}
  skip = {"global_every", "rope_local_base", "query_scale"}
  bad = []
  for key, value in want.items():
    if key in skip:
      continue
    ok = (
        math.isclose(have[key], value, rel_tol=1e-9)
        if isinstance(value, float)
        else have[key] == value
    )
    if not ok:
      bad.append(f"{key}={value!r} (config.model.{key}={have[key]!r})")
  eff = lambda q, d: q if q > 0 else float(d)
  if not math.isclose(
      eff(cfg.query_scale, cfg.head_dim),
      eff(want["query_scale"], want["head_dim"]),
  ):
    bad.append(
        f"query_scale={want['query_scale']!r} "
        f"(config.model.query_scale={cfg.query_scale!r})"
    )
  pattern = [cfg.is_global(i) for i in range(cfg.num_layers)]
  if cfg.num_layers == want["num_layers"] and (
      pattern != derived["_layer_is_global"]
  ):
    bad.append(
        f"global_every={want['global_every']} and "
        f"sliding_window={want['sliding_window']} (config.model gives "
        f"global layers {[i for i, g in enumerate(pattern) if g]})"
    )
  elif any(not g for g in pattern) and not math.isclose(
      cfg.rope_local_base, want["rope_local_base"]
  ):
    bad.append(
        f"rope_local_base={want['rope_local_base']!r} "
        f"(config.model.rope_local_base={cfg.rope_local_base!r})"
    )
  if bad:
    raise CheckpointFileError(
        f"Checkpoint {path} does not match config.model: it has "
        + "; ".join(bad)
        + ". Use the config that matches the checkpoint."
    )


def hf_vocabulary(path: str, kind: str) -> dict[str, Any]:
  """`spade.model.tokenizer.read_vocabulary`'s dict from a Hugging Face dir.

  Reads `tokenizer.json` (a byte-level BPE: Qwen2, Qwen2.5, Qwen3) and the
  special tokens of `tokenizer_config.json`. Ids the tokenizer does not name
  (the model's vocabulary is padded past it) become unused `[PADi]` entries,
  as llama.cpp writes them; added special tokens are control tokens.

  Args:
    path: the model directory.
    kind: `config.tokenizer.kind`; only "qwen_bpe" is read from Hugging Face
      files.
  """
  if kind != "qwen_bpe":
    raise CheckpointFileError(
        f"config.tokenizer.kind={kind!r} cannot be read from a Hugging Face"
        " directory; only 'qwen_bpe' (tokenizer.json) is."
    )
  file = os.path.join(path, "tokenizer.json")
  if not os.path.exists(file):
    raise CheckpointFileError(f"{path} has no tokenizer.json.")
  with open(file, encoding="utf-8") as f:
    body = json.load(f)
  model = body.get("model", {})
  if model.get("type") != "BPE":
    raise CheckpointFileError(
        f"{file} holds a {model.get('type')!r} model, not a byte-level BPE."
    )
  normal, control, user, unused = 1, 3, 4, 5  # llama.cpp's token types
  ids = {token: int(i) for token, i in model["vocab"].items()}
  kinds = {i: normal for i in ids.values()}
  for added in body.get("added_tokens", []):
    ids[added["content"]] = int(added["id"])
    kinds[int(added["id"])] = control if added.get("special") else user
  size = max(kinds) + 1
  tokens = [f"[PAD{i}]" for i in range(size)]
  types = [unused] * size
  for token, i in ids.items():
    tokens[i], types[i] = token, kinds[i]
  merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
  specials = {}
  config_file = os.path.join(path, "tokenizer_config.json")
  if os.path.exists(config_file):
    with open(config_file, encoding="utf-8") as f:
      specials = json.load(f)

  def special_id(name, default):
    token = specials.get(name)
    if isinstance(token, dict):
      token = token.get("content")
    if token is None:
      return default
    if token not in ids:
      raise CheckpointFileError(
          f"{config_file}: {name} {token!r} is not in {file}."
      )
    return ids[token]

  eos = special_id("eos_token", ids.get("<|endoftext|>"))
  if eos is None:
    raise CheckpointFileError(f"{path}: no eos_token in tokenizer_config.json.")
  return {
      "tokens": tokens,
      "types": types,
      "merges": merges,
      "eos_id": eos,
      "pad_id": special_id("pad_token", eos),
      "bos_id": special_id("bos_token", eos),
  }


def _expected_layer_keys(cfg: architecture.ModelConfig) -> set[tuple[str, ...]]:
  keys = {
      ("pre_attention_norm", "scale"),
      ("pre_ffw_norm", "scale"),
      ("attn", "o_proj", "kernel"),
      ("mlp", "gate", "kernel"),
      ("mlp", "up", "kernel"),
      ("mlp", "down", "kernel"),
  }
  for proj in ("q_proj", "k_proj", "v_proj"):
    keys.add(("attn", proj, "kernel"))
    if cfg.qkv_bias:
      keys.add(("attn", proj, "bias"))
  if cfg.qk_norm:
    keys |= {("attn", "q_norm", "scale"), ("attn", "k_norm", "scale")}
  if cfg.family == "gemma3":
    keys |= {("post_attention_norm", "scale"), ("post_ffw_norm", "scale")}
  return keys


def _layer_entry(rest: str, value: np.ndarray, cfg: architecture.ModelConfig):
  """(keys under layer_N, value in our layout, is a norm) or None."""
  n, kv, d, e = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.embed_dim
  gemma = cfg.family == "gemma3"
  norms = {
      "input_layernorm.weight": ("pre_attention_norm", "scale"),
      "post_attention_layernorm.weight": (
          ("post_attention_norm", "scale")
          if gemma
          else ("pre_ffw_norm", "scale")
      ),
      "pre_feedforward_layernorm.weight": ("pre_ffw_norm", "scale"),
      "post_feedforward_layernorm.weight": ("post_ffw_norm", "scale"),
      "self_attn.q_norm.weight": ("attn", "q_norm", "scale"),
      "self_attn.k_norm.weight": ("attn", "k_norm", "scale"),
  }
  if rest in norms:
    return norms[rest], value, True
  proj = re.fullmatch(r"self_attn\.([qkv])_proj\.(weight|bias)", rest)
  if proj:
    heads = n if proj[1] == "q" else kv
    keys = ("attn", f"{proj[1]}_proj")
    if proj[2] == "bias":
      return keys + ("bias",), value.reshape(heads, d), False
    # [H*D, E] -> [E, H, D]: a strided view, nothing is copied here.
    return keys + ("kernel",), value.T.reshape(e, heads, d), False
  if rest == "self_attn.o_proj.weight":
    return ("attn", "o_proj", "kernel"), value.T.reshape(n, d, e), False
  mlp = re.fullmatch(r"mlp\.(gate|up|down)_proj\.weight", rest)
  if mlp:
    return ("mlp", mlp[1], "kernel"), value.T, False  # [out, in] -> [in, out]
  if rest.endswith("rotary_emb.inv_freq"):
    return None  # recomputed by the model from the config
  raise CheckpointFileError(
      f"tensor layers.N.{rest} is not one this loader knows how to place."
  )


def hf_tree(path: str, model_config) -> tuple[dict[str, Any], np.ndarray]:
  """The per-layer tree of a Hugging Face directory, not read yet.

  Args:
    path: the model directory.
    model_config: `config.model`; checked against `config.json`.

  Returns:
    (the tree with `embedder`, `layer_N` and `final_norm` but no `heads`, of
    `placement.Lazy` leaves; the output layer as a memory-mapped view: `lm_head`, or
    the input embedding when the checkpoint ties them).
  """
  cfg = architecture.ModelConfig.from_config(model_config)
  derived = model_config_from_hf(read_hf_config(path), path)
  check_model_config(derived, cfg, path)
  gemma = cfg.family == "gemma3"
  tree: dict[str, Any] = {}
  embedding = lm_head = None
  for file in _weight_files(path):
    for name, value in read_safetensors(file).items():
      if name.startswith(_SKIP_PREFIXES):
        continue
      if name in _LM_HEAD:
        lm_head = value
        continue
      rest = next(
          (name[len(p) :] for p in _TEXT_PREFIXES if name.startswith(p)), name
      )
      expected = None
      if rest == "embed_tokens.weight":
        keys, plus_one, embedding = (
            ("embedder", "input_embedding"),
            False,
            value,
        )
        expected = (cfg.vocab_size, cfg.embed_dim)
      elif rest == "norm.weight":
        keys, plus_one = ("final_norm", "scale"), gemma
      else:
        match = _LAYER.match(rest)
        if not match:
          raise CheckpointFileError(
              f"{file}: tensor {name} is not one this loader knows how to"
              " place."
          )
        try:
          entry = _layer_entry(match[2], value, cfg)
        except ValueError as e:  # a reshape that does not fit
          raise CheckpointFileError(
              f"{file}: tensor {name} of shape {list(value.shape)} does not fit"
              f" config.model ({e})."
          ) from e
        if entry is None:
          continue
        sub, value, is_norm = entry
        keys, plus_one = (f"layer_{match[1]}",) + sub, is_norm and gemma
      if expected and tuple(value.shape) != expected:
        raise CheckpointFileError(
            f"{file}: tensor {name} has shape {list(value.shape)}, expected"
            f" {list(expected)} from config.model."
        )
      placement.set_leaf(tree, keys, placement.Lazy(value, plus_one))
  _check_complete(tree, cfg, path, embedding)
  output = lm_head if lm_head is not None else embedding
  if tuple(output.shape) != (cfg.vocab_size, cfg.embed_dim):
    raise CheckpointFileError(
        f"{path}: lm_head has shape {list(output.shape)}, expected "
        f"{[cfg.vocab_size, cfg.embed_dim]}."
    )
  return tree, output


def _check_complete(tree, cfg, path, embedding) -> None:
  missing = []
  if embedding is None:
    missing.append("embed_tokens")
  if "final_norm" not in tree:
    missing.append("norm")
  expected = _expected_layer_keys(cfg)
  for i in range(cfg.num_layers):
    layer = tree.get(f"layer_{i}", {})
    have = {keys for keys, _ in placement.flat_items(layer)}
    missing += [f"layer_{i}/{'/'.join(k)}" for k in sorted(expected - have)]
    extra = have - expected
    if extra:
      raise CheckpointFileError(
          f"Checkpoint {path} has {sorted('/'.join(k) for k in extra)} in "
          f"layer {i}, which config.model does not use."
      )
  extra_layers = sorted(
      k
      for k in tree
      if k.startswith("layer_") and int(k.split("_")[1]) >= cfg.num_layers
  )
  if extra_layers or missing:
    raise CheckpointFileError(
        f"Checkpoint {path}: missing {missing}, extra {extra_layers}."
    )


def hf_params(path: str, model_config, mesh=None, rules=()) -> dict[str, Any]:
  """Reads a Hugging Face directory into the model's parameters.

  Args:
    path: a directory with `config.json` and `*.safetensors` (see the
      module docstring for the architectures).
    model_config: `config.model`; must match `config.json`.
    mesh: place each tensor on this mesh as it is read; None: default device.
    rules: `config.mesh.rules`, with `mesh`.

  Returns:
    The parameters in the model's layout (`layout.to_model_layout`), of
    `config.model.param_dtype`; each head (`transformer.head_names`) is an
    array of its own equal to the checkpoint's output layer.
  """
  tree, output = hf_tree(path, model_config)
  return placement.materialize(
      placement.with_heads(tree, output, model_config),
      model_config,
      mesh,
      rules,
  )
