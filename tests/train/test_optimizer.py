"""The optimizer's weight decay: Megatron's rule (the reference's trainer)."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from spade import config as config_lib
from spade.train import state as state_lib


def _params():
  return {
      "embedder": {"input_embedding": jnp.ones((8, 4))},
      "layers": {
          "attn": {
              "q_proj": {
                  "kernel": jnp.ones((4, 2, 2)),
                  "bias": jnp.ones((2, 2)),
              },
          },
          # A scanned stack: the norm's scale gains a layer axis.
          "pre_attention_norm": {"scale": jnp.ones((3, 4))},
      },
      "final_norm": {"scale": jnp.ones((4,))},
      "other_vector": jnp.ones((4,)),
  }


def _moved_after_one_step(mask: str) -> dict:
  c = ml_collections.ConfigDict(config_lib.base_config().optim.to_dict())
  c.learning_rate = 0.1
  c.weight_decay = 0.5
  c.grad_clip = 0.0
  c.weight_decay_mask = mask
  optimizer = state_lib.make_optimizer(c)
  params = _params()
  zero = jax.tree.map(jnp.zeros_like, params)
  updates, _ = optimizer.update(zero, optimizer.init(params), params)
  # With a zero gradient only the decay moves a parameter.
  return jax.tree.map(lambda u: bool(np.abs(np.asarray(u)).max() > 0), updates)


def test_megatron_mask_decays_matrices_only():
  assert config_lib.base_config().optim.weight_decay_mask == "megatron"
  moved = _moved_after_one_step("megatron")
  assert moved["embedder"]["input_embedding"]
  assert moved["layers"]["attn"]["q_proj"]["kernel"]
  assert not moved["layers"]["attn"]["q_proj"]["bias"]
  assert not moved["layers"]["pre_attention_norm"]["scale"]
  assert not moved["final_norm"]["scale"]
  assert not moved["other_vector"]


def test_all_mask_decays_everything():
  moved = _moved_after_one_step("all")
  assert all(jax.tree.leaves(moved))


def test_unknown_mask_is_refused():
  c = config_lib.base_config()
  c.optim.weight_decay_mask = "none"
  with pytest.raises(config_lib.ConfigError, match="weight_decay_mask"):
    config_lib.validate(c)
