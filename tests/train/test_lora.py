"""LoRA (`optim.lora_rank > 0`): the update trains factors, params follow."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade.model import transformer
from spade.train import lora
from spade.train import update
from tests.train import test_update as base

setup = base.setup  # the module fixture: tiny model, batch for both roles
RANK = 4
pytestmark = pytest.mark.slow  # each test compiles an update (~25 s of CPU)


def _lora_config(**optim):
  return base._config(lora_rank=RANK, lora_alpha=8.0, **optim)


def _flat(tree):
  return {
      "/".join(str(getattr(p, "key", p)) for p in path): np.asarray(leaf)
      for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
  }


def test_adapters_cover_every_projection_and_head_but_not_the_embedding(
    setup,
):
  adapters = lora.init_adapters(setup["params"], RANK, jax.random.PRNGKey(0))
  params = _flat(setup["params"])
  kernels = {
      k for k in params if k.endswith("/kernel") or k.endswith("/unembedding")
  }
  assert set(adapters) == kernels
  assert not any("embedder" in k or "norm" in k for k in adapters)
  # Factor shapes: the embed side is one factor, the rest the other.
  q = adapters["layers/block_0/attn/q_proj/kernel"]
  w = params["layers/block_0/attn/q_proj/kernel"]  # [L, embed, heads, dim]
  assert q["a"].shape == w.shape[:2] + (RANK,)
  assert q["b"].shape == (w.shape[0], RANK) + w.shape[2:]
  o = adapters["layers/block_0/attn/o_proj/kernel"]  # [L, heads, dim, embed]
  assert o["a"].shape == params["layers/block_0/attn/o_proj/kernel"].shape[
      :3
  ] + (RANK,)
  for v in adapters.values():
    assert not np.any(np.asarray(v["b"]))  # B starts at zero
    assert np.std(np.asarray(v["a"])) > 0


def test_attach_keeps_the_value_and_gives_the_factors_gradient(setup):
  """d/dA, d/dB of loss(x·W + x·A·sB - sg(x·A·sB)) equal those of
  loss(W + s·AB), and the attached model's output is W's, exactly."""
  params = jax.tree.map(jnp.asarray, setup["params"])
  adapters = lora.init_adapters(params, RANK, jax.random.PRNGKey(1))
  # Non-zero B, so both factors' gradients are non-trivial.
  adapters = jax.tree.map(
      lambda x: x + 0.05 * jax.random.normal(jax.random.PRNGKey(2), x.shape),
      adapters,
  )
  scale = 2.0
  model = setup["model"]
  sub = setup["batch"]["agent"]

  def logits_of(p):
    logits, _ = model.apply(
        lora.variables(p),
        sub["tokens"],
        sub["positions"],
        transformer.Role.AGENT,
        input_mask=sub["input_mask"],
    )
    return logits

  def loss(p):
    return jnp.mean(jax.nn.log_softmax(logits_of(p))[..., 0] ** 2)

  attached = lora.attach(params, adapters, scale)
  assert np.array_equal(
      np.asarray(jax.jit(logits_of)(attached)),
      np.asarray(jax.jit(logits_of)(params)),
  )
  # One {a, b} per adapted kernel, at its module's path; the gradients
  # below show that each module reads its own.
  assert len(jax.tree.leaves(attached.lora)) == 2 * len(adapters)

  # W0 = W - s·A0B0 (A0, B0: these factors, held fixed), so that
  # W0 + s·AB is W at these factors and depends on them directly.
  zero = jax.tree.map(jnp.zeros_like, adapters)
  w0 = lora.shift(params, adapters, zero, scale)

  def direct(adapters):
    return loss(lora.shift(w0, zero, adapters, scale))

  g_trick = jax.jit(jax.grad(lambda ad: loss(lora.attach(params, ad, scale))))(
      adapters
  )
  g_direct = jax.jit(jax.grad(direct))(adapters)
  for path in adapters:
    for f in ("a", "b"):
      np.testing.assert_allclose(
          g_trick[path][f], g_direct[path][f], rtol=1e-3, atol=1e-5
      )
      # Every factor is reached, the output layer's too: the agent's loss
      # reads heads/shared, the one output layer.
      assert np.abs(np.asarray(g_trick[path][f])).max() > 0


@pytest.mark.parametrize("epochs", [1, 2])
def test_update_trains_the_factors_and_params_follow(setup, epochs):
  c = _lora_config(epochs=epochs)
  mesh = base._mesh(c, 2, 2, 2)
  optimizer, state = base._state(setup, c, mesh, seed=3)
  start = jax.device_get(state.adapters)
  # Adam's moments are over the factors only.
  mu = state.opt_state[1][0].mu if c.optim.grad_clip > 0 else None
  assert jax.tree.structure(mu) == jax.tree.structure(state.adapters)
  step = update.make_update_step(setup["model"], optimizer, mesh, c)
  new, metrics = step(state, setup["batch"])
  metrics = jax.device_get(metrics)
  assert metrics["train/grad_norm"] > 0
  assert metrics["train/optimizer_steps"] == epochs
  adapters = jax.device_get(new.adapters)
  scale = update.lora_scale(c.optim)
  assert scale == 2.0
  # Every factor moved (B from zero); params = initial + s·A'B' exactly up
  # to float rounding, and nothing else moved.
  for path in adapters:
    assert np.abs(adapters[path]["b"] - start[path]["b"]).max() > 0
  delta = lora.merged_delta(setup["params"], adapters, scale)
  before, after = _flat(setup["params"]), _flat(jax.device_get(new.params))
  for path, w0 in before.items():
    if path in delta:
      np.testing.assert_allclose(
          after[path] - w0, np.asarray(delta[path]), atol=2e-6
      )
      assert np.abs(after[path] - w0).max() > 0
    else:
      assert np.array_equal(after[path], w0), path
  # The factors stay sharded like their kernels (the rank axis unsharded).
  b = new.adapters["layers/block_0/mlp/gate/kernel"]["b"]
  assert b.sharding.spec == jax.sharding.PartitionSpec(None, None, "tensor")


def test_lora_steps_raise_the_rewarded_tokens_logprob(setup):
  """Positive advantages on every row: the sampled tokens become likelier."""
  c = _lora_config(learning_rate=1e-2)
  mesh = base._mesh(c, 1, 1, 1)
  optimizer, state = base._state(setup, c, mesh, seed=4)
  batch = {
      name: dict(sub, advantages=np.ones_like(sub["advantages"]))
      for name, sub in setup["batch"].items()
  }
  step = update.make_update_step(setup["model"], optimizer, mesh, c)

  def mean_logprob(params):
    sub = batch["agent"]
    lp = np.asarray(
        setup["logprobs"](
            params,
            sub["tokens"],
            sub["positions"],
            sub["input_mask"],
            True,
        )
    )
    mask = sub["loss_mask"].copy()
    mask[:, 0] = False
    return (lp * mask).sum() / mask.sum()

  start = mean_logprob(jax.device_get(state.params))
  for _ in range(5):
    state, _ = step(state, batch)
  end = mean_logprob(jax.device_get(state.params))
  assert end > start + 0.5, (start, end)
  # And the opposite sign lowers it: the factors follow the advantage.
  batch = {
      name: dict(sub, advantages=-np.ones_like(sub["advantages"]))
      for name, sub in batch.items()
  }
  for _ in range(5):
    state, _ = step(state, batch)
  assert mean_logprob(jax.device_get(state.params)) < end - 0.5


def test_negative_rank_is_a_config_error():
  from spade import config as config_lib  # pylint: disable=g-import-not-at-top

  c = config_lib.base_config()
  c.optim.lora_rank = -1
  with pytest.raises(config_lib.ConfigError, match="lora_rank"):
    config_lib.validate(c)


def test_state_with_adapters_checkpoints_and_restores(setup, tmp_path):
  from spade.train import checkpoints  # pylint: disable=g-import-not-at-top

  c = _lora_config()
  mesh = base._mesh(c, 2, 2, 1)
  optimizer, state = base._state(setup, c, mesh, seed=5)
  manager = checkpoints.make_manager(str(tmp_path))
  checkpoints.save(manager, 1, state, {"cursor": 1})
  step, restored, _ = checkpoints.restore_latest(
      manager, checkpoints.abstract_like(state)
  )
  assert step == 1
  assert set(restored.adapters) == set(state.adapters)
  for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert a.sharding == b.sharding
