"""`lora.shift` moves a stacked kernel a layer at a time, in place."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from spade import config as config_lib
from spade.model import transformer
from spade.train import lora


def _params(layers=8, embed=256, mlp=1024):
  c = config_lib.base_config().model
  c.update(
      num_layers=layers, embed_dim=embed, mlp_dim=mlp, num_heads=2,
      num_kv_heads=1, head_dim=64, vocab_size=512, sliding_window=0,
  )  # fmt: skip
  params = nn.unbox(transformer.init_params(c, jax.random.PRNGKey(0)))
  return params


def _whole(params, old, new, scale):
  """The change of every kernel formed whole, as one batched product."""

  def fn(w, path, lead, back):
    assert back is None  # [in, out] kernels (tests/model/test_kernel_layout)
    both = {
        "a": jnp.concatenate([new[path]["a"], old[path]["a"]], axis=-1),
        "b": jnp.concatenate([new[path]["b"], -old[path]["b"]], axis=lead),
    }
    return (w + scale * lora.product(both, lead)).astype(w.dtype)

  return lora._map_kernels(params, old, fn)  # pylint: disable=protected-access


def test_shift_a_layer_at_a_time_equals_the_whole_change():
  # The layer loop computes the same products in the same order: equal to
  # the bit (its memory, measured on the 1.5B's shapes: docs/results.md).
  params = _params()
  old = lora.init_adapters(params, 4, jax.random.PRNGKey(1))
  new = jax.tree.map(lambda x: x + 0.25, old)
  got = jax.jit(lambda p: lora.shift(p, old, new, 2.0))(params)
  want = jax.jit(lambda p: _whole(p, old, new, 2.0))(params)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
