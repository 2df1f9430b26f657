r"""Gemma 3 27B on a Cloud TPU slice: reference-sized self-play iterations.

Launch on a v5p-256 slice (128 chips, 32 hosts) with XManager:

  python launch/xm_launch.py --config=configs/gemma3_27b_tpu.py \
      --tpu=v5p-256 --workdir=gs://BUCKET/spade/gemma3_27b \
      --config.checkpoint.path=/gcs/BUCKET/gemma-3-27b-it-Q8_0.gguf

Add `--dry_run` to print the job instead of launching it. The tiny CPU
variant (same family switches and mesh axes, 8 fake devices):

  python -m spade.main --config=configs/gemma3_27b_tpu.py:runlocal \
      --workdir=/tmp/gemma3_27b_runlocal

Shapes, mesh and rollout sizes live in `gemma3_1b_tpu.py` (one table for the
four sizes); this file picks the 27B row.
"""

import importlib.util
import os


def _base():
  """Loads the shared Gemma 3 table from gemma3_1b_tpu.py beside this file."""
  path = os.path.join(os.path.dirname(__file__), "gemma3_1b_tpu.py")
  spec = importlib.util.spec_from_file_location("gemma3_1b_tpu", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def get_config(arg=None):
  """Gemma 3 27B pod config; `arg="runlocal"` is its tiny CPU variant."""
  return _base().gemma3_tpu_config("27b", arg)
