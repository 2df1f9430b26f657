r"""Gemma 3 on a Cloud TPU slice: reference-sized self-play iterations.

One file for the four sizes; the argument picks one, optionally with the tiny
CPU variant: `1b` (the default), `4b`, `12b`, `27b`, or `SIZE,runlocal`.
Launch 1B on a v5p-32 slice (16 chips, 4 hosts) with XManager:

  python launch/xm_launch.py --config=configs/gemma3_tpu.py:1b \
      --tpu=v5p-32 --workdir=gs://BUCKET/spade/gemma3_1b \
      --config.checkpoint.path=/gcs/BUCKET/gemma-3-1b-it-Q8_0.gguf

4B fits the same v5p-32, 12B a v5p-128 (64 chips) and 27B a v5p-256 (128
chips): `--config=configs/gemma3_tpu.py:27b --tpu=v5p-256`, with that size's
GGUF file. Add `--dry_run` to print the job instead of launching it. On one
host, or to try a size's shape on CPU (8 fake devices, tiny model, same mesh
axes):

  python -m spade.main --config=configs/gemma3_tpu.py:1b,runlocal \
      --workdir=/tmp/gemma3_1b_runlocal

The settings every TPU config shares are `spade.config.tpu_pod_config`, with
the published shapes of `spade.model.architecture.gemma3_shapes` (linear RoPE
scaling 8 on the global layers of 4B and up).

Mesh: parameters are sharded FSDP-style over `mesh.fsdp` devices and, for the
larger sizes, their heads and MLP over `mesh.tensor` devices; `mesh.data=-1`
takes every remaining device, so one size fits any slice whose chip count is
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

_FILE = "configs/gemma3_tpu.py"


def get_config(arg=None):
  """The pod config of one Gemma 3 size, or its tiny `runlocal` variant.

  Args:
    arg: "SIZE" or "SIZE,runlocal", SIZE one of `MESH` ("1b", "4b", "12b",
      "27b"); None or "" is "1b". "runlocal" keeps the size's settings with a
      tiny byte-level model, small rollouts and a 2x2 (fsdp x tensor) mesh,
      so it builds and steps on a CPU with 8 fake devices.

  Returns:
    A `ConfigDict` that passes `spade.config.validate`.
  """
  size, _, variant = (arg or "1b").partition(",")
  if size == "runlocal" and not variant:
    size, variant = "1b", "runlocal"
  if size not in MESH:
    raise ValueError(
        f"{_FILE} has no variant {arg!r}: give a size, one of"
        f" {sorted(MESH)}, optionally followed by ',runlocal'"
    )
  return config_lib.tpu_pod_config(
      architecture.gemma3_shapes(size),
      fsdp=MESH[size][0],
      tensor=MESH[size][1],
      checkpoint_kind="gemma3_gguf",
      tokenizer_kind="gemma_sp",
      variant=variant,
      config_file=f"{_FILE}:{size}",
  )
