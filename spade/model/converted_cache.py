"""The converted copy of a GGUF file, which loads in seconds.

Dequantizing a GGUF file takes more than a minute for Gemma 3 270M, so the
first load keeps the converted float32 tensors as one safetensors file under
`gguf_files.cache_dir()/converted/`, keyed by the source file's path, size
and modification time and by the model config (`cache_key`); later starts
memory-map it and place it on the mesh (`spade.model.placement`). Each
tensor's CRC-32 is stored in the file; a copy that cannot be read or fails a
CRC is reported and rebuilt.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
import sys
import time
import zlib
from typing import Any

import jax
import numpy as np

from spade.model import architecture
from spade.model import gguf_files
from spade.model import gguf_tensors
from spade.model import hf
from spade.model import placement

# Bump when the cached tree's meaning changes (names, norm convention).
_CACHE_VERSION = 2

_CACHE_FORMAT = f"spade-converted-gguf-v{_CACHE_VERSION}"

# Keys of config.model that do not change the stored values. The heads
# (`separate_heads`) are built from the one stored output layer on loading.
# (The converted copy holds [in, out] kernels whatever
# `model.kernel_layout`: `placement.materialize` transposes them as it reads.)
_NOT_IN_KEY = (
    "max_len",
    "dtype",
    "remat",
    "separate_heads",
    "kernel_layout",
)

# The stored name of the checkpoint's output layer, whatever heads the config
# builds from it: the name copies written before `model.separate_heads`
# existed use, so they still load.
_OUTPUT = "heads/designer/unembedding"

# Smaller GGUF files dequantize in well under a second: a copy would cost
# more disk and time than it saves (and tests' tiny files would fill the
# cache).
MIN_CACHED_BYTES = 16 << 20


def _log(message: str) -> None:
  print(f"[spade.checkpoint] {message}", file=sys.stderr, flush=True)


def cache_key(source: str, kind: str, model_config) -> str:
  """Names the converted copy of `source` for `model_config`.

  Changes with the file (its real path, size and modification time), the
  checkpoint kind, every `config.model` key that changes the values, and the
  cache format.
  """
  stat = os.stat(source)
  model = dataclasses.asdict(architecture.ModelConfig.from_config(model_config))
  for key in _NOT_IN_KEY:
    model.pop(key, None)
  material = json.dumps(
      dict(
          version=_CACHE_VERSION,
          source=os.path.realpath(source),
          size=stat.st_size,
          mtime_ns=stat.st_mtime_ns,
          kind=kind,
          model=model,
      ),
      sort_keys=True,
  )
  return f"{kind}-{hashlib.sha256(material.encode()).hexdigest()[:16]}"


def _crc32(value: np.ndarray) -> int:
  return zlib.crc32(np.ascontiguousarray(value).reshape(-1).view(np.uint8))


def _write_converted(file: str, content: dict[str, np.ndarray]) -> None:
  """Writes float32 tensors as one safetensors file with a CRC per tensor."""
  header, offset, crcs = {}, 0, {}
  for name, value in content.items():
    size = value.size * 4
    header[name] = {
        "dtype": "F32",
        "shape": list(value.shape),
        "data_offsets": [offset, offset + size],
    }
    crcs[name] = _crc32(np.asarray(value, np.float32))
    offset += size
  header["__metadata__"] = {
      "format": _CACHE_FORMAT,
      "crc32": json.dumps(crcs),
  }
  raw = json.dumps(header).encode()
  raw += b" " * (-len(raw) % 8)  # the spec's padding: data 8-byte aligned
  tmp = f"{file}.tmp{os.getpid()}"
  with open(tmp, "wb") as f:
    f.write(struct.pack("<Q", len(raw)) + raw)
    for value in content.values():
      f.write(np.ascontiguousarray(value, np.float32).tobytes())
  # Renamed only when complete: a copy cut short by a crash is never seen.
  os.replace(tmp, file)


def _read_converted(file: str) -> dict[str, np.ndarray]:
  """Memory-maps a converted copy; raises ValueError when it is damaged."""
  with open(file, "rb") as f:
    (header_len,) = struct.unpack("<Q", f.read(8))
    metadata = json.loads(f.read(header_len)).get("__metadata__", {})
  if metadata.get("format") != _CACHE_FORMAT:
    raise ValueError(f"format {metadata.get('format')!r}")
  crcs = json.loads(metadata["crc32"])
  tensors = hf.read_safetensors(file)
  if set(tensors) != set(crcs):
    raise ValueError("the tensor list differs from the checksums")
  for name, value in tensors.items():
    if _crc32(value) != crcs[name]:
      raise ValueError(f"tensor {name} fails its CRC-32")
    placement.release_pages(value)
  return tensors


def gguf_content(path: str, config) -> dict[str, np.ndarray]:
  """A GGUF file dequantized: flat name -> float32, with no heads but the
  checkpoint's output layer, stored as `_OUTPUT`.

  The output layer is kept only when it is not the embedding (untied): tied
  heads are rebuilt from the embedding.
  """
  tree = gguf_tensors.gguf_params(path, config.model, config.checkpoint.kind)
  heads = tree.pop("heads")
  output = next(iter(heads.values()))["unembedding"]  # all heads are equal
  content = {"/".join(k): v for k, v in placement.flat_items(tree)}
  if not np.array_equal(output, content["embedder/input_embedding"]):
    content[_OUTPUT] = output
  return content


def place_content(content: dict[str, np.ndarray], model_config, mesh, rules):
  """Places a flat content dict tensor by tensor; returns the parameters,
  with the heads `config.model` builds (`transformer.head_names`)."""
  output = content.get(_OUTPUT, content["embedder/input_embedding"])
  tree: dict[str, Any] = {}
  for name, value in content.items():
    if name != _OUTPUT:
      placement.set_leaf(tree, tuple(name.split("/")), placement.Lazy(value))
  return placement.materialize(
      placement.with_heads(tree, output, model_config),
      model_config,
      mesh,
      rules,
  )


def cached_gguf_params(config, path: str, mesh=None, rules=()) -> Any:
  """GGUF parameters through the converted copy in the cache directory.

  The first call dequantizes `path` and writes the float32 tensors to
  `gguf_files.cache_dir()/converted/KEY.safetensors` (see `cache_key`);
  later calls memory-map that file and place it tensor by tensor. A copy
  that cannot be read or fails a tensor's CRC-32 is reported on stderr and
  rebuilt. (An orbax copy was tried first: restoring Gemma 3 270M took
  33-41 s against 1.7 s for reading the same bytes raw.)
  """
  root = os.path.join(gguf_files.cache_dir(), "converted")
  file = os.path.join(
      root, cache_key(path, config.checkpoint.kind, config.model)
  )
  file += ".safetensors"
  if os.path.exists(file):
    start = time.perf_counter()
    try:
      content = _read_converted(file)
    except Exception as e:  # pylint: disable=broad-except
      # Whatever is wrong with the copy, the source file is still good.
      _log(
          f"converted copy {file} is corrupt ({type(e).__name__}: "
          f"{str(e).splitlines()[0] if str(e) else ''}); rebuilding it from "
          f"{path}"
      )
    else:
      params = place_content(content, config.model, mesh, rules)
      jax.block_until_ready(params)
      _log(
          f"loaded {file} in {time.perf_counter() - start:.1f} s "
          f"(converted from {path})"
      )
      return params
  start = time.perf_counter()
  content = gguf_content(path, config)
  converted = time.perf_counter() - start
  if jax.process_count() > 1:
    # Each host would need the whole copy on its own disk; read the source.
    return place_content(content, config.model, mesh, rules)
  os.makedirs(root, exist_ok=True)
  _write_converted(file, content)
  _log(f"converted {path} in {converted:.1f} s; kept a copy in {file}")
  del content  # the copy is read back through the page cache, not twice
  return place_content(_read_converted(file), config.model, mesh, rules)
