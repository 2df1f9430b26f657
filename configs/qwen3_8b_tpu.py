r"""Qwen3 8B on a Cloud TPU slice, from a Hugging Face checkpoint directory.

The reference's Qwen3-8B (cmd/models/qwen3-8B.sh: 36 layers, 4096 wide, 32
heads in 8 groups, head dim 128, SwiGLU 12288, q/k RMSNorm, untied output
layer). Launch on a v5p-32 slice (16 chips, 4 hosts) with XManager, the
checkpoint being the Hugging Face directory of Qwen/Qwen3-8B:

  python launch/xm_launch.py --config=configs/qwen3_8b_tpu.py \
      --tpu=v5p-32 --workdir=gs://BUCKET/spade/qwen3_8b \
      --config.checkpoint.path=/gcs/BUCKET/Qwen3-8B

Add `--dry_run` to print the job instead of launching it. The tiny CPU
variant (same family switches and mesh axes, 8 fake devices):

  python -m spade.main --config=configs/qwen3_8b_tpu.py:runlocal \
      --workdir=/tmp/qwen3_8b_runlocal

The settings live in `qwen3_4b_tpu.py`; this file picks the 8B row.
"""

import importlib.util
import os


def _base():
  """Loads the shared Qwen3 settings from qwen3_4b_tpu.py beside this file."""
  path = os.path.join(os.path.dirname(__file__), "qwen3_4b_tpu.py")
  spec = importlib.util.spec_from_file_location("qwen3_4b_tpu", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def get_config(arg=None):
  """Qwen3 8B pod config; `arg="runlocal"` is its tiny CPU variant."""
  return _base().qwen3_tpu_config("8b", arg)
