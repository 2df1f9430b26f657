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
  measured = script.run(config, slots, prompt, calls=2, decode_steps=8)
  # Every slot's cache, each layer (no sliding window): keys and values,
  # and each position's int32 time (the attention's mask reads it).
  assert not m.sliding_window
  cache = 2 * m.num_layers * slots * m.max_len * m.num_kv_heads * m.head_dim
  cache *= np.dtype(m.dtype).itemsize
  cache += m.num_layers * slots * m.max_len * 4
  assert measured["cache_bytes"] == cache
  # The weights once, not the input embedding's table.
  params = transformer.init_params(m, jax.random.key(0))
  leaves = lambda t: sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(t))
  weights = leaves(params) - leaves(params["embedder"])
  assert measured["min_bytes_per_step"] == weights + cache
  assert measured["steps_per_call"] == 8 and measured["slots"] == slots
  step = measured["step_s"]
  assert step > 0
  # The printed figures: tokens a second, the bandwidth the minimum takes
  # and its share of the measured bound.
  printed = script.figures(measured, bandwidth=2e9)
  assert float(printed["tok_s"]) == pytest.approx(slots / step, abs=0.05)
  achieved = (weights + cache) / step
  assert float(printed["achieved_gbs"]) == pytest.approx(
      achieved / 1e9, abs=0.005
  )
  assert float(printed["roofline_frac"]) == pytest.approx(
      achieved / 2e9, abs=5e-4
  )
  assert float(printed["step_ms"]) == pytest.approx(step * 1e3, rel=1e-3)


def test_shapes_that_do_not_fit_the_cache_say_what_to_pass():
  script = _script()
  config = config_lib.load_file("configs/tiny.py", ROOT)
  with pytest.raises(SystemExit, match="leaves no room"):
    script.run(config, 2, config.model.max_len, calls=1)
  with pytest.raises(SystemExit, match="shorter --prompt or fewer --calls"):
    script.run(config, 2, config.model.max_len - 20, calls=4, decode_steps=8)
