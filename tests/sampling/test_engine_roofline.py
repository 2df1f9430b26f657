"""benchmarks/engine_roofline.py: the slot engine's decode against the
memory roofline, the script a lent GPU runs (benchmarks/device.sh). Here on
the tiny model: its figures are the engine's, and bad shapes are refused
with what to pass instead."""

import importlib.util
import os

import jax
import numpy as np
import pytest

from spade import config as config_lib
from spade.model import transformer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def _script():
  path = os.path.join(ROOT, "benchmarks", "engine_roofline.py")
  spec = importlib.util.spec_from_file_location("engine_roofline", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_the_timed_calls_run_every_slot_and_the_minimum_is_weights_and_cache():
  script = _script()
  config = config_lib.load_file("configs/tiny.py", ROOT)
  m = config.model
  slots, prompt = 4, 100
  figures = script.run(config, slots, prompt, calls=2, decode_steps=8)
  # Every slot's cache, keys and values, each layer (no sliding window).
  assert not m.sliding_window
  itemsize = np.dtype(m.dtype).itemsize
  cache = 2 * m.num_layers * slots * m.max_len * m.num_kv_heads * m.head_dim
  cache *= itemsize
  assert float(figures["cache_gib"]) == pytest.approx(cache / 2**30, abs=0.01)
  # The weights once, not the input embedding's table.
  params = transformer.init_params(m, jax.random.key(0))
  leaves = lambda t: sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(t))
  weights = leaves(params) - leaves(params["embedder"])
  assert float(figures["min_bytes_per_step_mib"]) == pytest.approx(
      (weights + cache) / 2**20, abs=0.1
  )
  step = float(figures["step_ms"]) / 1e3
  assert float(figures["tok_s"]) == pytest.approx(slots / step, rel=0.01)
  assert float(figures["achieved_gbs"]) == pytest.approx(
      (weights + cache) / step / 1e9, rel=0.01
  )
  assert figures["steps_per_call"] == 8 and figures["slots"] == slots


def test_shapes_that_do_not_fit_the_cache_say_what_to_pass():
  script = _script()
  config = config_lib.load_file("configs/tiny.py", ROOT)
  with pytest.raises(SystemExit, match="leaves no room"):
    script.run(config, 2, config.model.max_len, calls=1)
  with pytest.raises(SystemExit, match="shorter --prompt or fewer --calls"):
    script.run(config, 2, config.model.max_len - 20, calls=4, decode_steps=8)
