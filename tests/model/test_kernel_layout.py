"""`model.kernel_layout="out_in"`: kernels stored [out, in], the same model.

The CPU configs of real models store their projections transposed
(`layers.TRANSPOSED`) because XLA's CPU backend streams them about twice as
fast in a matmul of a few rows; everything that reads a kernel must give
what the [in, out] layout gives: the forward, greedy sampling, the scratch
init's shapes and logical axes, the adapters' factors and their shift.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade import config as config_lib
from spade.model import architecture
from spade.model import layers
from spade.model import transformer
from spade.sampling import sampler as sampler_lib
from spade.train import lora

PAD = 0


def _model(layout="in_out"):
  c = config_lib.base_config().model
  c.update(
      num_layers=3, embed_dim=64, mlp_dim=96, num_heads=4, num_kv_heads=2,
      head_dim=16, vocab_size=300, sliding_window=0, qkv_bias=True,
      kernel_layout=layout,
  )  # fmt: skip
  return c


@pytest.fixture(scope="module")
def both():
  params = nn.unbox(transformer.init_params(_model(), jax.random.PRNGKey(0)))
  return params, layers.kernels_out_in(params)


def _flat(tree):
  return {
      "/".join(str(getattr(p, "key", p)) for p in path): np.asarray(leaf)
      for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
  }


def test_every_projection_is_transposed_and_nothing_else(both):
  io, oi = _flat(both[0]), _flat(both[1])
  kernels = [k for k in io if k.endswith("/kernel")]
  assert len(kernels) == 7 and all("layers/" in k for k in kernels)
  for k in kernels:
    t = oi.pop(k + "_t")
    c = layers.CONTRACTED[k.split("/")[-2]]
    # [L, *in, *out] -> [L, *out, *in]
    assert (
        t.shape
        == (io[k].shape[0],) + io[k].shape[1 + c :] + io[k].shape[1 : 1 + c]
    )
    np.testing.assert_array_equal(layers.to_out_in(t, t.ndim - 1 - c, 1), io[k])
  assert set(oi) == {k for k in io if not k.endswith("/kernel")}


def test_scratch_init_has_the_same_shapes_and_axes(both):
  got = jax.eval_shape(
      lambda: nn.unbox(
          transformer.init_params(_model("out_in"), jax.random.PRNGKey(0))
      )
  )
  assert jax.tree.map(np.shape, got) == jax.tree.map(np.shape, both[1])
  axes = _flat(transformer.param_logical_axes(both[1]))
  down = transformer.param_logical_axes(both[1])["layers"]["block_0"]["mlp"]
  assert tuple(down["down"][layers.TRANSPOSED]) == ("layers", "embed", "mlp")
  o = transformer.param_logical_axes(both[1])["layers"]["block_0"]["attn"]
  assert tuple(o["o_proj"][layers.TRANSPOSED]) == (
      "layers", "embed", "heads", "head_dim",
  )  # fmt: skip
  assert axes  # every leaf has axes (param_logical_axes raises otherwise)


def test_a_bad_layout_is_refused():
  with pytest.raises(ValueError, match="kernel_layout='rows'"):
    architecture.ModelConfig.from_config(_model("rows"))


def test_forward_and_greedy_sampling_equal_the_in_out_layout(both):
  tokens = jax.random.randint(jax.random.PRNGKey(5), (2, 12), 1, 300)
  pos = jnp.broadcast_to(jnp.arange(12), tokens.shape)
  logits = {}
  for layout, params in zip(("in_out", "out_in"), both):
    model = transformer.build_model(_model(layout))
    logits[layout] = np.asarray(
        model.apply({"params": params}, tokens, pos, transformer.Role.AGENT)[0]
    )
  np.testing.assert_allclose(
      logits["out_in"], logits["in_out"], rtol=1e-5, atol=1e-5
  )
  out = {}
  for layout, params in zip(("in_out", "out_in"), both):
    sampler = sampler_lib.Sampler(
        *transformer.sampling_fns(_model(layout), transformer.Role.AGENT),
        pad_id=PAD,
    )
    out[layout] = np.asarray(
        sampler(
            params,
            [[5, 6, 7, 8], [9, 10]],
            max_new_tokens=12,
            rng=jax.random.PRNGKey(0),
            temperature=0.0,
        ).tokens
    )
  np.testing.assert_array_equal(out["out_in"], out["in_out"])


def test_adapters_and_their_shift_are_the_in_out_layouts(both):
  io, oi = both
  a_io = lora.init_adapters(io, 4, jax.random.PRNGKey(1))
  a_oi = lora.init_adapters(oi, 4, jax.random.PRNGKey(1))
  # The same factors (A on the inputs, B on the outputs), keyed by the
  # stored leaf's path.
  assert {k.replace("/kernel_t", "/kernel") for k in a_oi} == set(a_io)
  for k, v in a_oi.items():
    w = a_io[k.replace("/kernel_t", "/kernel")]
    for f in ("a", "b"):
      np.testing.assert_array_equal(np.asarray(v[f]), np.asarray(w[f]))
  moved = lambda a: jax.tree.map(lambda x: x + 0.125, a)
  got = lora.shift(oi, a_oi, moved(a_oi), 2.0)
  want = layers.kernels_out_in(lora.shift(io, a_io, moved(a_io), 2.0))
  # A few float32 ulps of the kernels' largest entries (about 0.4): the two
  # layouts sum A.B's products in different orders (on an AMD EPYC host,
  # 3e-8 apart).
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(
        np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-7
    )
  # The shift moved the kernels (the check above is not of two no-ops).
  assert not np.allclose(
      np.asarray(got["layers"]["block_0"]["mlp"]["up"][layers.TRANSPOSED]),
      np.asarray(oi["layers"]["block_0"]["mlp"]["up"][layers.TRANSPOSED]),
  )
  delta = lora.merged_delta(oi, moved(a_oi), 2.0)
  want = lora.merged_delta(io, moved(a_io), 2.0)
  k = "layers/block_0/attn/o_proj/kernel"
  np.testing.assert_allclose(
      np.asarray(delta[k + "_t"]),
      np.asarray(layers.to_out_in(want[k], 2, 1)),
      rtol=1e-6,
  )


def test_attached_gradients_equal_the_in_out_layouts(both):
  tokens = jax.random.randint(jax.random.PRNGKey(6), (2, 10), 1, 300)
  pos = jnp.broadcast_to(jnp.arange(10), tokens.shape)
  grads = {}
  for layout, params in zip(("in_out", "out_in"), both):
    model = transformer.build_model(_model(layout))
    adapters = lora.init_adapters(params, 4, jax.random.PRNGKey(1))
    adapters = jax.tree.map(lambda x: x + 0.05, adapters)

    def loss(ad, params=params, model=model):
      logits = model.apply(
          lora.variables(lora.attach(params, ad, 2.0)),
          tokens,
          pos,
          transformer.Role.AGENT,
      )[0]
      return jnp.mean(jax.nn.log_softmax(logits)[..., 3] ** 2)

    g = jax.grad(loss)(adapters)
    grads[layout] = {k.replace("/kernel_t", "/kernel"): v for k, v in g.items()}
  assert set(grads["out_in"]) == set(grads["in_out"])
  for k, v in grads["in_out"].items():
    for f in ("a", "b"):
      # Float32 sums in two orders over gradients up to about 3 (on an
      # AMD EPYC host, 1.3e-6 apart): an atol of 1e-5 is 3e-6 of the
      # largest, while a kernel read in the wrong layout is off by O(1).
      np.testing.assert_allclose(
          np.asarray(grads["out_in"][k][f]), np.asarray(v[f]),
          rtol=1e-4, atol=1e-5,
      )  # fmt: skip
