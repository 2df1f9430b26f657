r"""Gemma 3 1B on a Cloud TPU slice: reference-sized self-play iterations.

Launch on a v5p-32 slice (16 chips, 4 hosts) with XManager:

  python launch/xm_launch.py --config=configs/gemma3_1b_tpu.py \
      --tpu=v5p-32 --workdir=gs://BUCKET/spade/gemma3_1b \
      --config.checkpoint.path=/gcs/BUCKET/gemma-3-1b-it-Q8_0.gguf

Add `--dry_run` to print the job instead of launching it. On one host, or to
try the shape on CPU (8 fake devices, tiny model, same mesh axes):

  python -m spade.main --config=configs/gemma3_1b_tpu.py:runlocal \
      --workdir=/tmp/gemma3_1b_runlocal

This file also holds the mesh table that `gemma3_4b_tpu.py`,
`gemma3_12b_tpu.py` and `gemma3_27b_tpu.py` use; the settings every TPU config
shares are `spade.config.tpu_pod_config`, with the published shapes of
`spade.model.architecture.gemma3_shapes` (linear RoPE scaling 8 on the global
layers of 4B and up).

Mesh: parameters are sharded FSDP-style over `mesh.fsdp` devices and, for the
larger sizes, their heads and MLP over `mesh.tensor` devices; `mesh.data=-1`
takes every remaining device, so one file fits any slice whose chip count is
a multiple of `fsdp * tensor` (v4 and v5p expose one JAX device per chip).
Rollouts follow the reference implementation: 24 environments an iteration,
16 episodes with and 16 without a hint each, up to 25 turns.
"""

from spade import config as config_lib
from spade.model import architecture

# Parameter sharding per size: (fsdp, tensor). fsdp grows with the model so
# float32 params + Adam moments (16 bytes/param) stay a few GB per chip;
# tensor parallelism starts at 12B, where one layer's MLP is too large for
# the per-chip budget to hold comfortably. Smallest slice: fsdp * tensor chips.
MESH = {"1b": (4, 1), "4b": (8, 1), "12b": (16, 4), "27b": (16, 8)}


def gemma3_tpu_config(size: str, arg: str | None = None):
  """Returns the pod config of Gemma 3 `size`, or its tiny `runlocal` variant.

  Args:
    size: one of "1b", "4b", "12b", "27b".
    arg: None or "" for the pod config; "runlocal" for the same settings with
      a tiny byte-level model, small rollouts and a 2x2 (fsdp x tensor) mesh,
      so it builds and steps on a CPU with 8 fake devices.

  Returns:
    A `ConfigDict` that passes `spade.config.validate`.
  """
  if size not in MESH:
    raise ValueError(f"unknown Gemma 3 size {size!r}; one of {sorted(MESH)}")
  return config_lib.tpu_pod_config(
      architecture.gemma3_shapes(size),
      fsdp=MESH[size][0],
      tensor=MESH[size][1],
      checkpoint_kind="gemma3_gguf",
      tokenizer_kind="gemma_sp",
      variant=arg,
      config_file=f"configs/gemma3_{size}_tpu.py",
  )


def get_config(arg=None):
  """Gemma 3 1B pod config; `arg="runlocal"` is its tiny CPU variant."""
  return gemma3_tpu_config("1b", arg)
