r"""Qwen3 4B on a Cloud TPU slice, from a Hugging Face checkpoint directory.

Launch on a v5p-32 slice (16 chips, 4 hosts) with XManager, the checkpoint
being the Hugging Face directory of Qwen/Qwen3-4B (config.json and
*.safetensors), copied to a bucket:

  python launch/xm_launch.py --config=configs/qwen3_4b_tpu.py \
      --tpu=v5p-32 --workdir=gs://BUCKET/spade/qwen3_4b \
      --config.checkpoint.path=/gcs/BUCKET/Qwen3-4B

Add `--dry_run` to print the job instead of launching it. The tiny CPU
variant (same family switches and mesh axes, 8 fake devices):

  python -m spade.main --config=configs/qwen3_4b_tpu.py:runlocal \
      --workdir=/tmp/qwen3_4b_runlocal

This file also holds the settings `qwen3_8b_tpu.py` uses, so the two sizes
cannot drift apart. Shapes come from `spade.model.architecture.qwen3_shapes`
(the Hugging Face configs: 4B ties its output layer to the embedding, 8B does
not); the loader checks them against the directory's config.json. Rollouts
follow the reference implementation, as in `gemma3_tpu.py`.
"""

from spade import config as config_lib
from spade.model import architecture

# Parameter sharding per size: (fsdp, tensor). Float32 master weights and
# Adam moments take 16 bytes a parameter: 4B over 8 chips and 8B over 16 are
# 8 GB a chip before activations.
MESH = {"4b": (8, 1), "8b": (16, 1)}


def qwen3_tpu_config(size: str, arg: str | None = None):
  """Returns the pod config of Qwen3 `size`, or its tiny `runlocal` variant.

  Args:
    size: "4b" or "8b".
    arg: None or "" for the pod config; "runlocal" for the same settings with
      a tiny byte-level model, small rollouts and a 2x2 (fsdp x tensor) mesh,
      so it builds and steps on a CPU with 8 fake devices.

  Returns:
    A `ConfigDict` that passes `spade.config.validate`.
  """
  if size not in MESH:
    raise ValueError(f"unknown Qwen3 size {size!r}; one of {sorted(MESH)}")
  c = config_lib.tpu_pod_config(
      architecture.qwen3_shapes(size),
      fsdp=MESH[size][0],
      tensor=MESH[size][1],
      checkpoint_kind="hf",
      tokenizer_kind="qwen_bpe",
      variant=arg,
      config_file=f"configs/qwen3_{size}_tpu.py",
  )
  # Every gathered count puts back only its steps' slots: compiled for
  # v5p-32 (2026-12-07), the 16-64-row calls (1-4 rows a chip) read less so
  # than with their rows put back whole (4B 1.15-1.28 -> 1.12-1.22 of the
  # minimum, 8B 1.19-1.32 -> 1.16-1.26), unlike Gemma 3's (docs/scale.md).
  c.sampling.put_steps_from = 1
  return c


def get_config(arg=None):
  """Qwen3 4B pod config; `arg="runlocal"` is its tiny CPU variant."""
  return qwen3_tpu_config("4b", arg)
