"""Initial parameters: from scratch or from a pretrained checkpoint.

`initial_params(config)` is the one entry point. `config.checkpoint.kind`:

  scratch      `transformer.init_params` with `config.seed`
  hf           the Hugging Face directory `config.checkpoint.path`
               (`spade.model.hf`)
  gemma3_gguf, qwen2_gguf
               the GGUF file (`gguf_files.find_checkpoint_file`), read by
               `spade.model.gguf_tensors` through its converted copy
               (`spade.model.converted_cache`) unless
               `config.checkpoint.cache` is False or the file is small

Every loader raises `CheckpointFileError` for a file that does not fit.
"""

from __future__ import annotations

import os
from typing import Any

import jax

from spade.model import converted_cache
from spade.model import gguf_files
from spade.model import gguf_tensors
from spade.model import hf
from spade.model import transformer

CheckpointFileError = gguf_files.CheckpointFileError


def initial_params(config, rng=None, mesh=None, rules=()) -> Any:
  """Returns the initial parameters for `config` (see the module docstring).

  Args:
    config: the full config.
    rng: a `jax.random` key for the scratch init; defaults to
      `PRNGKey(config.seed)`. Ignored for checkpoints.
    mesh: place every checkpoint tensor in its shards on this mesh as it is
      read (no device holds a whole copy); None: the default device. A
      scratch init under a mesh is `sharding.init_sharded_params`.
    rules: `config.mesh.rules`, with `mesh`.

  Returns:
    The parameter tree as jax arrays of `config.model.param_dtype`.
  """
  kind = config.checkpoint.kind
  if kind == "scratch":
    if rng is None:
      rng = jax.random.PRNGKey(config.seed)
    return transformer.init_params(config.model, rng)
  if kind not in gguf_tensors.ARCHITECTURES and kind != "hf":
    raise ValueError(
        f"config.checkpoint.kind={kind!r} is not one of scratch, "
        f"{', '.join(gguf_tensors.ARCHITECTURES)}, hf."
    )
  return load_checkpoint(config, mesh, rules)


def load_checkpoint(config, mesh=None, rules=()) -> Any:
  """The initial parameters from `config.checkpoint` (any non-scratch kind).

  "hf": the Hugging Face directory `config.checkpoint.path`. The GGUF kinds:
  the file from `gguf_files.find_checkpoint_file`, through the converted
  copy unless `config.checkpoint.cache` is False or the file is smaller than
  `converted_cache.MIN_CACHED_BYTES`.

  Args:
    config: the full config.
    mesh: place every tensor on this mesh as it is read or restored; None:
      the default device.
    rules: `config.mesh.rules`, with `mesh`.

  Returns:
    The parameters in the model's layout, of `config.model.param_dtype`.
  """
  ckpt = config.checkpoint
  if ckpt.kind == "hf":
    if not ckpt.path:
      raise ValueError(
          "config.checkpoint.kind='hf' needs --config.checkpoint.path=DIR, a"
          " Hugging Face model directory (config.json + *.safetensors)."
      )
    return hf.hf_params(ckpt.path, config.model, mesh, rules)
  path = gguf_files.find_checkpoint_file(config)
  worth_it = os.path.isfile(path) and (
      os.path.getsize(path) >= converted_cache.MIN_CACHED_BYTES
  )
  if ckpt.cache and worth_it:
    return converted_cache.cached_gguf_params(config, path, mesh, rules)
  content = converted_cache.gguf_content(path, config)
  return converted_cache.place_content(content, config.model, mesh, rules)
