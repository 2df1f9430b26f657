"""The int8 KV cache (`config.model.kv_cache_dtype="int8"`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade import config as config_lib
from spade.model import architecture
from spade.model import kv_cache
from spade.model import transformer as T


def test_quantize_rounds_each_vector_to_its_own_scale():
  x = (
      jax.random.normal(jax.random.key(0), (3, 5, 16))
      * jnp.array([0.01, 1.0, 300.0])[:, None, None]
  )
  x = x.at[1, 2].set(0.0)
  q, scale = kv_cache.quantize(x)
  assert q.dtype == jnp.int8 and scale.dtype == jnp.float32
  assert scale.shape == (3, 5)
  np.testing.assert_allclose(scale, np.abs(x).max(-1) / 127, rtol=1e-6)
  # Each vector's largest entry is +-127; every entry within half a step.
  np.testing.assert_array_equal(np.abs(q).max(-1)[scale > 0], 127)
  err = np.abs(np.asarray(q, np.float32) * scale[..., None] - x)
  assert (err <= scale[..., None] * 0.5 * (1 + 1e-5) + 1e-12).all()
  # A vector of zeros: scale 0, all zeros back.
  assert scale[1, 2] == 0 and not np.asarray(q[1, 2]).any()


def test_int8_cache_holds_int8_keys_beside_scales():
  cfg = config_lib.base_config().model
  cfg.num_layers, cfg.sliding_window, cfg.global_every = 3, 4, 3
  cfg.kv_cache_dtype = "int8"
  for per_layer in (True, False):
    cache = kv_cache.init_cache(cfg, 2, 16, per_layer=per_layer)
    for layer in jax.tree.leaves(cache, is_leaf=lambda x: "pos" in x):
      assert layer["k"].dtype == layer["v"].dtype == jnp.int8
      assert layer["k_scale"].shape == layer["k"].shape[:-1]
      assert layer["v_scale"].dtype == jnp.float32
  cfg.kv_cache_dtype = "int4"
  with pytest.raises(ValueError, match="kv_cache_dtype"):
    architecture.ModelConfig.from_config(cfg)


def test_int8_cache_decodes_within_its_rounding_of_the_float_cache():
  """Prefill 10 tokens and decode 4 more, one at a time, on both caches:
  the logits move by about the keys' and values' rounding, far less than
  the logits themselves (a cache read without its scales is off by O(1))."""
  cfg = config_lib.base_config().model
  cfg.num_layers, cfg.sliding_window, cfg.global_every = 3, 4, 3
  params = T.init_params(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (2, 14), 0, 256)
  logits = {}
  for kv in ("", "int8"):
    cfg.kv_cache_dtype = kv
    fns = T.sampling_fns(cfg, T.Role.AGENT)
    step = jax.jit(fns.tokens_to_logits)  # one compile a shape, not an op
    p = fns.prepare_params(params)
    cache = fns.init_cache(2, 16)
    ones = jnp.ones((2, 10), bool)
    pos = jnp.broadcast_to(jnp.arange(10), (2, 10))
    out, cache = step(p, tokens[:, :10], pos, ones, cache, jnp.int32(0))
    steps = [out]
    for t in range(10, 14):
      out, cache = step(
          p, tokens[:, t : t + 1], jnp.full((2, 1), t), ones[:, :1], cache,
          jnp.int32(t),
      )  # fmt: skip
      steps.append(out)
    logits[kv] = np.stack(steps)
  diff = np.abs(logits["int8"] - logits[""]).max()
  assert 0 < diff < 0.02 * np.abs(logits[""]).max(), diff


def test_int8_stacked_cache_decodes_what_the_per_layer_cache_decodes():
  """`model.scan_decode` writes the int8 cache through the stacked paths of
  `kv_cache.write` (a chunk, then one token): the logits of the per-layer
  cache's, up to float32 rounding."""
  cfg = config_lib.base_config().model
  cfg.num_layers, cfg.sliding_window, cfg.global_every = 3, 4, 3
  cfg.kv_cache_dtype = "int8"
  params = T.init_params(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (2, 7), 0, 256)
  out = {}
  for scan in (False, True):
    cfg.scan_decode = scan
    fns = T.sampling_fns(cfg, T.Role.AGENT)
    step = jax.jit(fns.tokens_to_logits)  # one compile a shape, not an op
    p, cache = fns.prepare_params(params), fns.init_cache(2, 16)
    pos = jnp.broadcast_to(jnp.arange(6), (2, 6))
    first, cache = step(
        p, tokens[:, :6], pos, jnp.ones_like(pos, bool), cache, jnp.int32(0)
    )
    second, cache = step(
        p, tokens[:, 6:], jnp.full((2, 1), 6), jnp.ones((2, 1), bool), cache,
        jnp.int32(6),
    )  # fmt: skip
    out[scan] = np.stack([first, second])
    layer = jax.tree.leaves(cache, is_leaf=lambda x: "k_scale" in x)[0]
    assert layer["k"].dtype == jnp.int8
  np.testing.assert_allclose(out[True], out[False], atol=1e-5)
