"""The decoder: parameter tree, scanned layout, published sizes, norms, RoPE,
cache, heads, remat policies, bfloat16."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade import config as config_lib
from spade.model import architecture
from spade.model import kv_cache
from spade.model import layers
from spade.model import layout
from spade.model import transformer as T


def _tiny(**overrides):
  """The base tiny model with 3 layers: two sliding (window 4), one global."""
  cfg = config_lib.base_config().model
  cfg.num_layers = 3
  cfg.sliding_window = 4
  cfg.global_every = 3
  cfg.update(overrides)
  return cfg


@pytest.fixture(scope="module")
def gemma():
  cfg = _tiny()
  return T.build_model(cfg), T.init_params(cfg, jax.random.key(0))


@pytest.fixture(scope="module")
def forward(gemma):
  """One jitted full forward (with mask) reused across tests."""
  model, _ = gemma

  @functools.partial(jax.jit, static_argnames="role")
  def run(params, tokens, positions, mask, role):
    return model.apply(
        {"params": params}, tokens, positions, role, input_mask=mask
    )[0]

  def call(params, tokens, role=T.Role.AGENT, positions=None, mask=None):
    if positions is None:
      positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    if mask is None:
      mask = jnp.ones(tokens.shape, bool)
    return run(params, tokens, positions, mask, role)

  return call


@pytest.fixture(scope="module")
def qwen():
  cfg = _tiny(
      family="qwen2",
      sliding_window=0,
      qk_norm=False,
      qkv_bias=True,
      mlp_activation="silu",
      scale_embeddings=False,
      rope_local_base=1e6,
  )
  return T.build_model(cfg), T.init_params(cfg, jax.random.key(1))


def _shapes(tree):
  return jax.tree.map(lambda x: tuple(x.shape), tree)


def _count(tree):
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))


def test_gemma_param_tree_follows_the_contract(gemma):
  """Three layers, global every third: one scanned block of three layers."""
  _, params = gemma
  shapes = _shapes(params)
  assert set(shapes) == {"embedder", "layers", "final_norm", "heads"}
  assert set(shapes["layers"]) == {"block_0", "block_1", "block_2"}
  assert shapes["embedder"] == {"input_embedding": (259, 64)}
  # One output layer, both roles' (the default `model.separate_heads`).
  assert shapes["heads"] == {"shared": {"unembedding": (259, 64)}}
  layer = shapes["layers"]["block_1"]  # leading axis: 1 scanned group
  assert layer["attn"] == {
      "q_proj": {"kernel": (1, 64, 4, 16)},
      "k_proj": {"kernel": (1, 64, 2, 16)},
      "v_proj": {"kernel": (1, 64, 2, 16)},
      "o_proj": {"kernel": (1, 4, 16, 64)},
      "q_norm": {"scale": (1, 16)},
      "k_norm": {"scale": (1, 16)},
  }
  assert layer["mlp"] == {
      "gate": {"kernel": (1, 64, 128)},
      "up": {"kernel": (1, 64, 128)},
      "down": {"kernel": (1, 128, 64)},
  }
  assert set(layer) == {
      "attn", "mlp", "pre_attention_norm", "post_attention_norm",
      "pre_ffw_norm", "post_ffw_norm",
  }  # fmt: skip
  np.testing.assert_array_equal(params["final_norm"]["scale"], np.ones(64))


def test_qwen_param_tree_has_biases_and_no_post_norms(qwen):
  """No sliding layers: one block per scanned step, 3 steps."""
  _, params = qwen
  assert set(params["layers"]) == {"block_0"}
  layer = _shapes(params)["layers"]["block_0"]
  assert set(layer) == {"attn", "mlp", "pre_attention_norm", "pre_ffw_norm"}
  assert layer["attn"] == {
      "q_proj": {"kernel": (3, 64, 4, 16), "bias": (3, 4, 16)},
      "k_proj": {"kernel": (3, 64, 2, 16), "bias": (3, 2, 16)},
      "v_proj": {"kernel": (3, 64, 2, 16), "bias": (3, 2, 16)},
      "o_proj": {"kernel": (3, 4, 16, 64)},
  }


def test_published_sizes_give_published_parameter_counts():
  """Gemma 3 270M has 268,098,176 parameters and Qwen2.5 0.5B 494,032,768.

  Both are tied models; ours keeps the output layer apart from the input
  embedding (one, shared by the roles, by default), so subtract the heads
  and count the input embedding once.
  """
  for shapes, expected in (
      (architecture.gemma3_shapes("270m"), 268_098_176),
      (architecture.qwen2_shapes("0.5b"), 494_032_768),
  ):
    cfg = config_lib.base_config().model
    cfg.update(shapes)
    model = T.build_model(cfg)
    tokens = jnp.zeros((1, 1), jnp.int32)
    abstract = jax.eval_shape(
        functools.partial(model.init, role=T.Role.AGENT),
        jax.random.key(0),
        tokens,
        tokens,
    )["params"]
    total = _count(nn.unbox(abstract))
    assert T.head_names(cfg) == ("shared",)
    heads = cfg.vocab_size * cfg.embed_dim
    assert total - heads == expected


def test_gemma3_shapes_table():
  s = architecture.gemma3_shapes("27b")
  assert (s["num_layers"], s["embed_dim"], s["num_heads"]) == (62, 5376, 32)
  assert (s["num_kv_heads"], s["head_dim"], s["mlp_dim"]) == (16, 128, 21504)
  assert s["query_scale"] == 5376 / 32 and s["sliding_window"] == 1024
  assert architecture.gemma3_shapes("1b")["mlp_dim"] == 6912
  assert architecture.gemma3_shapes("4b")["num_kv_heads"] == 4
  assert architecture.gemma3_shapes("12b")["embed_dim"] == 3840
  with pytest.raises(ValueError, match="choose one of"):
    architecture.gemma3_shapes("2b")


def test_layer_kinds_and_rope_bases():
  cfg = architecture.ModelConfig.from_config(architecture.gemma3_shapes("270m"))
  kinds = [cfg.is_global(i) for i in range(18)]
  assert [i for i, g in enumerate(kinds) if g] == [5, 11, 17]
  assert cfg.rope_base(5) == 1e6 and cfg.rope_base(0) == 1e4
  assert cfg.window(0) == 512 and cfg.window(5) == 0
  assert kv_cache.cache_sizes(cfg, 100)[:6] == [100] * 6
  assert kv_cache.cache_sizes(cfg, 2000)[:6] == [512] * 5 + [2000]
  qwen = architecture.ModelConfig.from_config(architecture.qwen2_shapes())
  assert all(qwen.is_global(i) for i in range(24))
  with pytest.raises(ValueError, match="unknown model config keys"):
    architecture.ModelConfig.from_config({"embed_dims": 3})


def test_rmsnorm_matches_formula():
  x = np.random.default_rng(0).normal(size=(2, 3, 8)).astype(np.float32)
  scale = np.linspace(0.5, 2.0, 8).astype(np.float32)
  y = layers.RMSNorm(1e-6, jnp.float32).apply({"params": {"scale": scale}}, x)
  ref = x / np.sqrt(np.mean(x**2, -1, keepdims=True) + 1e-6) * scale
  np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


def test_rope_is_rotate_half_and_relative():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(1, 1, 1, 8)).astype(np.float32)
  out = np.asarray(layers.apply_rope(x, jnp.array([[3]]), 10_000.0))
  freq = 10_000.0 ** (-np.arange(4) * 2 / 8)
  c, s = np.cos(3 * freq), np.sin(3 * freq)
  x1, x2 = x[..., :4], x[..., 4:]
  ref = np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
  # q.k depends on the position difference only.
  q = rng.normal(size=(1, 1, 1, 8)).astype(np.float32)

  def dot(pq, pk):
    rq = layers.apply_rope(q, jnp.array([[pq]]), 100.0)
    rk = layers.apply_rope(x, jnp.array([[pk]]), 100.0)
    return float(jnp.sum(rq * rk))

  assert dot(7, 2) == pytest.approx(dot(15, 10), rel=1e-4)


def test_cached_prefill_and_decode_match_full_forward(gemma, forward):
  """Chunks of 3 and 6 (ring scatter and roll paths) then single steps.

  The window (4) is shorter than the 12-token sequence, so every sliding
  layer's ring buffer wraps.
  """
  model, params = gemma
  tokens = jax.random.randint(jax.random.key(2), (2, 12), 0, 259)
  full = forward(params, tokens)

  @functools.partial(jax.jit, static_argnames="length")
  def run(params, chunk, start, cache, length):
    del length
    pos = start + jnp.broadcast_to(jnp.arange(chunk.shape[1]), chunk.shape)
    return model.apply(
        {"params": params},
        chunk,
        pos,
        T.Role.AGENT,
        cache=cache,
        cache_index=start,
    )

  for prefill in (3, 6):
    cache = kv_cache.init_cache(model.cfg, 2, 12)
    logits, cache = run(params, tokens[:, :prefill], 0, cache, prefill)
    np.testing.assert_allclose(logits, full[:, :prefill], atol=1e-5)
    for t in range(prefill, 12):
      logits, cache = run(params, tokens[:, t : t + 1], t, cache, 1)
      np.testing.assert_allclose(logits[:, 0], full[:, t], atol=1e-5)
  # The sliding layers hold only the last 4 positions, in ring order.
  blocks = cache["layers"]
  assert blocks["block_0"]["k"].shape == (1, 2, 2, 4, 16)
  np.testing.assert_array_equal(blocks["block_0"]["pos"][0, 0], [8, 9, 10, 11])
  assert blocks["block_2"]["k"].shape == (1, 2, 2, 12, 16)


def test_padding_is_never_attended(gemma, forward):
  """Row 1 is row 0 left-padded by 3: its real positions match row 0's."""
  _, params = gemma
  tokens = jax.random.randint(jax.random.key(3), (1, 12), 0, 259)
  padded = jnp.concatenate([jnp.full((1, 3), 256), tokens[:, :9]], 1)
  batch = jnp.concatenate([tokens, padded], 0)
  mask = jnp.stack([jnp.ones(12, bool), jnp.arange(12) >= 3])
  pos = jnp.stack([jnp.arange(12), jnp.maximum(jnp.arange(12) - 3, 0)])
  out = forward(params, batch, positions=pos, mask=mask)
  np.testing.assert_allclose(out[1, 3:], out[0, :9], atol=1e-5)


def _head_grads(cfg, params, tokens, role):
  """Gradient of `role`'s mean log-likelihood of `tokens` w.r.t. `params`."""
  model = T.build_model(cfg)
  positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)

  def loss(p):
    logp, _ = model.apply(
        {"params": p}, tokens, positions, role, targets=jnp.roll(tokens, -1, 1)
    )
    return -logp.mean()

  return jax.grad(loss)(params)


def _logits(cfg, params, tokens, role):
  positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
  model = T.build_model(cfg)
  logits, _ = model.apply({"params": params}, tokens, positions, role)
  return logits


def test_by_default_both_roles_read_one_shared_output_layer(gemma, forward):
  """The reference's one model: `heads/shared/unembedding` only; both roles'
  logits come from it, so the designer's loss moves the agent's logits
  through the output layer itself, not only through the trunk."""
  _, params = gemma
  cfg = _tiny()
  assert not cfg.separate_heads
  assert T.head_names(cfg) == ("shared",)
  assert {T.head_name(cfg, r) for r in T.Role} == {"shared"}
  assert set(params["heads"]) == {"shared"}
  tokens = jnp.arange(24).reshape(2, 12)
  agent = forward(params, tokens, T.Role.AGENT)
  np.testing.assert_array_equal(forward(params, tokens, T.Role.DESIGNER), agent)
  grads = _head_grads(cfg, params, tokens, T.Role.DESIGNER)
  step = grads["heads"]["shared"]["unembedding"]
  assert float(jnp.abs(step).max()) > 0
  # A step on the output layer alone (the trunk held fixed).
  table = params["heads"]["shared"]["unembedding"] - 10.0 * step
  moved = dict(params, heads={"shared": {"unembedding": table}})
  assert not np.allclose(forward(moved, tokens, T.Role.AGENT), agent)


def test_separate_heads_give_each_role_its_own_output_layer():
  """`model.separate_heads=True` (ours): two heads over the shared trunk,
  drawn independently; a role's loss has no gradient on the other head."""
  cfg = _tiny(separate_heads=True)
  assert T.head_names(cfg) == ("designer", "agent")
  assert [T.head_name(cfg, r) for r in T.Role] == ["designer", "agent"]
  params = T.init_params(cfg, jax.random.key(0))
  assert _shapes(params["heads"]) == {
      "designer": {"unembedding": (259, 64)},
      "agent": {"unembedding": (259, 64)},
  }
  heads = params["heads"]
  assert not np.allclose(
      heads["designer"]["unembedding"], heads["agent"]["unembedding"]
  )
  tokens = jnp.arange(24).reshape(2, 12)
  agent = _logits(cfg, params, tokens, T.Role.AGENT)
  assert not np.allclose(_logits(cfg, params, tokens, T.Role.DESIGNER), agent)
  same = dict(
      params, heads={"designer": heads["agent"], "agent": heads["agent"]}
  )
  np.testing.assert_array_equal(
      _logits(cfg, same, tokens, T.Role.DESIGNER), agent
  )
  grads = {r: _head_grads(cfg, params, tokens, r)["heads"] for r in T.Role}
  for role, other in ((T.Role.DESIGNER, "agent"), (T.Role.AGENT, "designer")):
    assert float(jnp.abs(grads[role][role.key]["unembedding"]).max()) > 0
    np.testing.assert_array_equal(grads[role][other]["unembedding"], 0.0)
  # A step on the designer's head leaves the agent's logits as they were.
  step = grads[T.Role.DESIGNER]["designer"]["unembedding"]
  table = heads["designer"]["unembedding"] - 10.0 * step
  moved = dict(
      params,
      heads={"designer": {"unembedding": table}, "agent": heads["agent"]},
  )
  np.testing.assert_array_equal(
      _logits(cfg, moved, tokens, T.Role.AGENT), agent
  )


def test_parameters_of_the_other_heads_setting_name_the_key_to_set(gemma):
  """Parameters written with separate heads, applied by a shared-head model
  (and the reverse): a ValueError naming `model.separate_heads`, not flax's
  missing-parameter error."""
  _, shared = gemma
  separate_cfg = _tiny(separate_heads=True)
  separate = T.init_params(separate_cfg, jax.random.key(0))
  tokens = jnp.zeros((1, 3), jnp.int32)
  with pytest.raises(ValueError, match=r"model\.separate_heads=True to use"):
    _logits(_tiny(), separate, tokens, T.Role.AGENT)
  with pytest.raises(ValueError, match=r"model\.separate_heads=False to use"):
    _logits(separate_cfg, shared, tokens, T.Role.DESIGNER)
  assert T.heads_mismatch(["shared"], ["shared"]) is None
  assert "no value of model.separate_heads" in T.heads_mismatch(
      ["agent"], ["shared"]
  )


def test_qwen_forward_decodes_with_cache(qwen):
  model, params = qwen
  tokens = jax.random.randint(jax.random.key(4), (1, 5), 0, 259)

  @jax.jit
  def run(params, tokens):
    apply = functools.partial(
        model.apply, {"params": params}, role=T.Role.AGENT
    )
    full = apply(tokens, jnp.arange(5)[None])[0]
    cache = kv_cache.init_cache(model.cfg, 1, 5)
    prefix, cache = apply(
        tokens[:, :4], jnp.arange(4)[None], cache=cache, cache_index=0
    )
    last, _ = apply(
        tokens[:, 4:], jnp.array([[4]]), cache=cache, cache_index=4,
        last_only=True,
    )  # fmt: skip
    return full, prefix, last

  full, prefix, last = run(params, tokens)
  np.testing.assert_allclose(prefix, full[:, :4], atol=1e-5)
  np.testing.assert_allclose(last[:, 0], full[:, 4], atol=1e-5)


def test_param_logical_axes_names_every_parameter(gemma):
  _, params = gemma
  axes = T.param_logical_axes(params)
  P = jax.sharding.PartitionSpec
  assert axes["embedder"]["input_embedding"] == P("vocab", "embed")
  block = axes["layers"]["block_0"]
  assert block["attn"]["o_proj"]["kernel"] == P(
      "layers", "heads", "head_dim", "embed"
  )
  assert block["mlp"]["down"]["kernel"] == P("layers", "mlp", "embed")
  # The per-layer layout of the loaders has no layer axis.
  unstacked = layout.to_per_layer_layout(
      params, architecture.ModelConfig.from_config(_tiny())
  )
  per_layer = T.param_logical_axes(unstacked)
  # Its MLP kernels take the decoding layout's names for the hidden width
  # (and down's output), its key and value kernels the cache's heads, and
  # its tables are split by their rows (`layers.DECODE_PARAM_AXES`); the
  # rest as in training.
  assert per_layer["layer_0"]["mlp"]["down"]["kernel"] == P(
      "decode_down", "decode_embed"
  )
  assert per_layer["layer_0"]["mlp"]["up"]["kernel"] == P(None, "decode_mlp")
  assert per_layer["layer_0"]["attn"]["k_proj"]["kernel"] == P(
      "embed", "cache_heads", "head_dim"
  )
  assert per_layer["layer_0"]["attn"]["o_proj"]["kernel"] == P(
      "heads", "head_dim", "embed"
  )
  assert T.param_logical_axes(unstacked, decoding=False)["layer_0"]["mlp"][
      "down"
  ]["kernel"] == P("mlp", "embed")
  assert per_layer["embedder"]["input_embedding"] == P("decode_vocab", None)
  for head in per_layer["heads"].values():
    assert head["unembedding"] == P("decode_vocab", None)
  assert per_layer["final_norm"]["scale"] == P("embed")
  with pytest.raises(ValueError, match="PARAM_AXES"):
    T.param_logical_axes({"mystery": {"w": np.zeros(3)}})


@pytest.mark.slow
def test_chunked_target_logprobs_equal_full_log_softmax():
  """The update's chunked scoring equals log_softmax of the full logits."""
  cfg = architecture.ModelConfig.from_config(config_lib.base_config().model)
  model = T.build_model(cfg)
  params = T.init_params(cfg, jax.random.PRNGKey(3))
  tokens = jax.random.randint(jax.random.PRNGKey(4), (2, 11), 0, 259)
  positions = jnp.broadcast_to(jnp.arange(11), (2, 11))
  logits, _ = model.apply({"params": params}, tokens, positions, T.Role.AGENT)
  want = jnp.take_along_axis(
      jax.nn.log_softmax(logits, -1), tokens[..., None], -1
  )[..., 0]
  for chunk in (1, 4, 11, 64):
    got, _ = model.apply(
        {"params": params},
        tokens,
        positions,
        T.Role.AGENT,
        targets=tokens,
        chunk=chunk,
    )
    np.testing.assert_allclose(got, want, atol=1e-5)

  # Gradients agree too (the chunks are rematerialised in the backward).
  def full(p):
    lg, _ = model.apply({"params": p}, tokens, positions, T.Role.AGENT)
    return jnp.sum(
        jnp.take_along_axis(jax.nn.log_softmax(lg, -1), tokens[..., None], -1)
    )

  def chunked(p):
    lp, _ = model.apply(
        {"params": p},
        tokens,
        positions,
        T.Role.AGENT,
        targets=tokens,
        chunk=4,
    )
    return jnp.sum(lp)

  g1, g2 = jax.grad(full)(params), jax.grad(chunked)(params)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
    np.testing.assert_allclose(a, b, atol=1e-4)


def test_score_mask_skips_chunks_with_nothing_to_score():
  """Chunks without a scored position give 0 and no gradient; the rest,
  and the gradient of the scored positions, are those of the full pass."""
  cfg = architecture.ModelConfig.from_config(config_lib.base_config().model)
  model = T.build_model(cfg)
  params = T.init_params(cfg, jax.random.PRNGKey(3))
  tokens = jax.random.randint(jax.random.PRNGKey(4), (2, 16), 0, 259)
  positions = jnp.broadcast_to(jnp.arange(16), (2, 16))
  # Chunks of 4: chunk 0 unscored, chunk 1 scored in row 1 only, chunk 2
  # unscored, chunk 3 scored in row 0.
  mask = np.zeros((2, 16), bool)
  mask[1, 5] = True
  mask[0, 12:15] = True

  @jax.jit
  def scored(p, score_mask):
    """The log-probs and the gradient of the scored positions' sum: one
    compilation a mask, not one a pass."""

    def loss(p):
      lp, _ = model.apply(
          {"params": p}, tokens, positions, T.Role.AGENT, targets=tokens,
          chunk=4, score_mask=score_mask,
      )  # fmt: skip
      return jnp.sum(jnp.where(mask, lp, 0.0)), lp

    (_, lp), grad = jax.value_and_grad(loss, has_aux=True)(p)
    return lp, grad

  (full, g1), (skipped, g2) = scored(params, None), scored(
      params, jnp.asarray(mask)
  )
  computed = np.zeros((2, 16), bool)
  computed[:, 4:8] = computed[:, 12:16] = True
  np.testing.assert_allclose(skipped[computed], full[computed], atol=1e-6)
  assert np.all(np.asarray(skipped)[~computed] == 0.0)
  assert np.all(np.asarray(full)[~computed] != 0.0)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
    np.testing.assert_allclose(a, b, atol=1e-5)


def _reference_forward(cfg, per_layer, tokens, role=T.Role.AGENT):
  """The decoder as a Python loop over `layer_i` subtrees, unscanned.

  Built from the model's own `Block`, embedder scaling, final norm and head,
  so it checks the scan, the stacking and the local/global pattern.
  """
  cfg = architecture.ModelConfig.from_config(cfg)
  positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
  x = per_layer["embedder"]["input_embedding"][tokens]
  if cfg.scale_embeddings:
    x = x * jnp.sqrt(float(cfg.embed_dim))
  for i in range(cfg.num_layers):
    x, _ = layers.Block(cfg, cfg.is_global(i)).apply(
        {"params": per_layer[f"layer_{i}"]},
        x, positions, positions, None, None, None,
    )  # fmt: skip
  x = layers.RMSNorm(cfg.norm_eps, jnp.float32).apply(
      {"params": per_layer["final_norm"]}, x
  )
  table = per_layer["heads"][T.head_name(cfg, role)]["unembedding"]
  return jnp.einsum("ble,ve->blv", x, table)


def test_stacked_layout_round_trips_and_matches_a_layer_loop():
  """5 layers, global every 2: two scanned pairs and a one-layer tail."""
  cfg = _tiny(num_layers=5, global_every=2)
  mc = architecture.ModelConfig.from_config(cfg)
  assert mc.stacks() == [("layers", 0, 2, 2), ("tail", 4, 1, 1)]
  params = T.init_params(cfg, jax.random.key(5))
  assert set(params) == {"embedder", "layers", "tail", "final_norm", "heads"}
  per_layer = layout.to_per_layer_layout(params, cfg)
  assert {k for k in per_layer if k.startswith("layer_")} == {
      f"layer_{i}" for i in range(5)
  }
  # Layer g * 2 + j is index g of block_j; the tail's layer 4 is tail/block_0.
  np.testing.assert_array_equal(
      per_layer["layer_3"]["mlp"]["up"]["kernel"],
      params["layers"]["block_1"]["mlp"]["up"]["kernel"][1],
  )
  np.testing.assert_array_equal(
      per_layer["layer_4"]["attn"]["q_proj"]["kernel"],
      params["tail"]["block_0"]["attn"]["q_proj"]["kernel"][0],
  )
  back = layout.to_model_layout(per_layer, cfg)
  assert jax.tree.structure(back) == jax.tree.structure(params)
  for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params)):
    np.testing.assert_array_equal(a, b)
  # Already stacked: returned as is. Host (numpy) trees stay on the host.
  assert layout.to_model_layout(params, cfg).keys() == params.keys()
  host = layout.to_model_layout(jax.tree.map(np.asarray, per_layer), cfg)
  assert isinstance(
      host["layers"]["block_0"]["mlp"]["up"]["kernel"], np.ndarray
  )
  with pytest.raises(ValueError, match="num_layers=5"):
    layout.to_model_layout({k: v for k, v in per_layer.items() if k != "layer_4"},
                      cfg)  # fmt: skip

  tokens = jax.random.randint(jax.random.key(6), (2, 12), 0, 259)
  positions = jnp.broadcast_to(jnp.arange(12), tokens.shape)
  scanned = T.build_model(cfg).apply(
      {"params": params}, tokens, positions, T.Role.AGENT
  )[0]
  np.testing.assert_allclose(
      scanned, _reference_forward(cfg, per_layer, tokens), atol=1e-5
  )


def test_published_sizes_scan_their_local_global_period():
  cfg = architecture.ModelConfig.from_config(
      architecture.gemma3_shapes("1b")
  )  # 26 = 4 * 6 + 2
  assert cfg.stacks() == [("layers", 0, 4, 6), ("tail", 24, 1, 2)]
  cache = jax.eval_shape(lambda: kv_cache.init_cache(cfg, 2, 2000))
  assert cache["layers"]["block_0"]["k"].shape == (4, 2, 1, 512, 256)
  assert cache["layers"]["block_5"]["k"].shape == (4, 2, 1, 2000, 256)
  assert cache["tail"]["block_1"]["pos"].shape == (1, 2, 512)
  assert architecture.ModelConfig.from_config(
      architecture.gemma3_shapes("270m")
  ).stacks() == [("layers", 0, 3, 6)]
  assert architecture.ModelConfig.from_config(
      architecture.qwen2_shapes()
  ).stacks() == [("layers", 0, 24, 1)]


def test_remat_names_match_the_config_choices():
  choices = set(config_lib._CHOICES["model.remat"])
  assert choices == set(architecture.REMAT_POLICIES) | set(
      architecture._REMAT_ALIASES
  )
  assert architecture.ModelConfig.from_config({"remat": True}).remat == "full"
  assert architecture.ModelConfig.from_config({"remat": False}).remat == "none"
  with pytest.raises(ValueError, match="remat"):
    architecture.ModelConfig.from_config({"remat": "sometimes"})


def _scored(cfg, params, tokens):
  """Sum of the next-token log-probs (the update's scoring path)."""
  positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
  logp, _ = T.build_model(cfg).apply(
      {"params": params}, tokens, positions, T.Role.AGENT,
      targets=jnp.roll(tokens, -1, axis=1), chunk=8,
  )  # fmt: skip
  return logp


@pytest.mark.slow  # one compilation per policy
def test_every_remat_policy_gives_the_same_loss_and_gradients():
  # Two layers, one sliding and one global: each kind of layer under every
  # policy, and two blocks in the scanned body to compile, not `_tiny`'s
  # three.
  two = dict(num_layers=2, global_every=2)
  cfg = _tiny(**two)
  params = T.init_params(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(8), (2, 16), 0, 259)

  def loss_and_grad(name):
    c = _tiny(remat=name, **two)
    fn = jax.jit(jax.value_and_grad(lambda p: jnp.mean(_scored(c, p, tokens))))
    return fn(params)

  l0, g0 = loss_and_grad("none")
  for policy in sorted(set(architecture.REMAT_POLICIES) - {"none"}):
    l1, g1 = loss_and_grad(policy)
    np.testing.assert_allclose(l1, l0, rtol=1e-6, err_msg=policy)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
      np.testing.assert_allclose(a, b, atol=1e-6, err_msg=policy)


@pytest.mark.parametrize("family", ["gemma3", "qwen2"])
def test_chunked_attention_gives_the_same_loss_and_gradients(family):
  # Queries in blocks of 4 against every key: sliding and global layers,
  # left padding (the mask), one row with GQA groups of 2.
  extra = dict(family="qwen2", sliding_window=0, qk_norm=False)
  cfg = _tiny(**(extra if family == "qwen2" else {}))
  params = T.init_params(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(9), (2, 16), 0, 259)
  mask = jnp.arange(16)[None, :] >= jnp.array([[0], [5]])
  positions = jnp.maximum(jnp.arange(16)[None, :] - jnp.array([[0], [5]]), 0)

  def loss_and_grad(chunk):
    c = dict(cfg, attention_chunk=chunk, remat="full")
    model = T.build_model(c)

    def loss(p):
      logp, _ = model.apply(
          {"params": p}, tokens, positions, T.Role.AGENT, input_mask=mask,
          targets=jnp.roll(tokens, -1, axis=1), chunk=8,
      )  # fmt: skip
      return jnp.sum(jnp.where(mask, logp, 0.0))

    return jax.jit(jax.value_and_grad(loss))(params)

  l0, g0 = loss_and_grad(0)
  l1, g1 = loss_and_grad(4)
  np.testing.assert_allclose(l1, l0, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
    np.testing.assert_allclose(a, b, atol=1e-5)


# Measured on this tiny model (random init, 4 x 64 random tokens): bfloat16
# activations over float32 parameters moved the token log-probs by 0.0077 on
# average and 0.043 at most. The bounds leave room for bfloat16 parameters
# and other seeds, and stay far below a real error (a wrong cast or mask
# moves log-probs by whole nats).
_BF16_MEAN_TOL, _BF16_MAX_TOL = 0.03, 0.2


def test_decoding_weights_in_the_activations_type_change_no_value():
  # bfloat16 activations over float32 weights (the TPU configs): the
  # decoding layout holds the matmul weights in bfloat16 (every use casts
  # them first), so a step reads half and converts nothing; its logits
  # and cache are those of the float32 weights, to the bit.
  c = _tiny(dtype="bfloat16", param_dtype="float32", qkv_bias=True)
  params = nn.unbox(T.init_params(c, jax.random.key(0)))
  fns = T.sampling_fns(c, T.Role.AGENT)
  prepared = fns.prepare_params(params)
  plain = layout.to_per_layer_layout(params, c)
  kinds = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(prepared):
    kinds.setdefault(str(path[-1].key), set()).add(str(leaf.dtype))
  for name in ("kernel", "input_embedding", "unembedding"):
    assert kinds[name] == {"bfloat16"}, name
  for name in ("scale", "bias"):
    assert kinds[name] == {"float32"}, name
  tokens = jax.random.randint(jax.random.key(3), (2, 6), 1, 259)
  pos = jnp.broadcast_to(jnp.arange(6), (2, 6))
  mask = jnp.ones((2, 6), bool)
  # Jitted, as the samplers run it (and one compilation a layout, not an
  # eager dispatch per op).
  step = jax.jit(fns.tokens_to_logits)
  got = step(prepared, tokens, pos, mask, fns.init_cache(2, 8), 0)
  want = step(plain, tokens, pos, mask, fns.init_cache(2, 8), 0)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
  # float32 activations keep float32 weights (the CPU configs).
  f32 = T.sampling_fns(_tiny(), T.Role.AGENT).prepare_params(params)
  assert {x.dtype for x in jax.tree.leaves(f32)} == {jnp.dtype(jnp.float32)}


@pytest.mark.slow
def test_bfloat16_log_probs_stay_close_to_float32():
  cfg = _tiny()
  params = T.init_params(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(9), (4, 64), 0, 259)
  want = _scored(cfg, params, tokens)
  as_bf16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
  for param_dtype, p in (("float32", params), ("bfloat16", as_bf16)):
    c = _tiny(dtype="bfloat16", param_dtype=param_dtype)
    got = _scored(c, p, tokens)
    assert got.dtype == jnp.float32
    diff = np.abs(np.asarray(got) - np.asarray(want))[:, :-1]
    assert diff.mean() < _BF16_MEAN_TOL, (param_dtype, diff.mean())
    assert diff.max() < _BF16_MAX_TOL, (param_dtype, diff.max())
    assert diff.max() > 0  # the activations really were bfloat16
  # A bfloat16 scratch init and cache, float32 logits.
  c = _tiny(dtype="bfloat16", param_dtype="bfloat16")
  p = T.init_params(c, jax.random.key(0))
  assert {x.dtype for x in jax.tree.leaves(p)} == {jnp.dtype(jnp.bfloat16)}
  cache = kv_cache.init_cache(c, 2, 8)
  assert cache["layers"]["block_0"]["k"].dtype == jnp.bfloat16
  logits, cache = T.build_model(c).apply(
      {"params": p}, tokens[:2, :8], jnp.broadcast_to(jnp.arange(8), (2, 8)),
      T.Role.AGENT, cache=cache, cache_index=0,
  )  # fmt: skip
  assert logits.dtype == jnp.float32
  assert cache["layers"]["block_2"]["v"].dtype == jnp.bfloat16


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gemma3", "qwen2"])
def test_per_layer_decoding_matches_the_scanned_model(family):
  """The sampler decodes per layer (`sampling_fns`); the scanned stacks with
  a stacked cache (`scan_decode`) give the same logits, step after step, on
  a model with a full period and a tail, and a ring buffer that wraps."""
  overrides = dict(num_layers=5, sliding_window=3, global_every=2)
  if family == "qwen2":
    overrides = dict(num_layers=3, family="qwen2", sliding_window=0,
                     qk_norm=False, qkv_bias=True, mlp_activation="silu")  # fmt: skip
  per_cfg = _tiny(**overrides)
  scan_cfg = _tiny(scan_decode=True, **overrides)
  params = T.init_params(per_cfg, jax.random.key(7))
  tokens = jax.random.randint(jax.random.key(8), (2, 9), 0, 259)

  def decode(cfg):
    fns = T.sampling_fns(cfg, T.Role.AGENT)

    @jax.jit
    def run(params):
      p = fns.prepare_params(params)
      cache = fns.init_cache(2, 9)
      mask = jnp.ones((2, 4), bool)
      first, cache = fns.tokens_to_logits(
          p, tokens[:, :4], jnp.arange(4)[None].repeat(2, 0), mask, cache,
          jnp.int32(0),
      )  # fmt: skip
      out = [first]
      for t in range(4, 9):
        logits, cache = fns.tokens_to_logits(
            p, tokens[:, t : t + 1], jnp.full((2, 1), t), jnp.ones((2, 1), bool),
            cache, jnp.int32(t),
        )  # fmt: skip
        out.append(logits)
      return jnp.stack(out, 1)

    return run(params)

  per_layer = decode(per_cfg)
  assert "layer_0" in T.sampling_fns(per_cfg, T.Role.AGENT).init_cache(1, 4)
  np.testing.assert_allclose(per_layer, decode(scan_cfg), atol=1e-5)
  # And both match the full forward's logits at the same positions.
  full = T.build_model(per_cfg).apply(
      {"params": params}, tokens, jnp.arange(9)[None].repeat(2, 0),
      T.Role.AGENT,
  )[0]  # fmt: skip
  np.testing.assert_allclose(per_layer[:, 1:], full[:, 4:], atol=1e-4)
  np.testing.assert_allclose(per_layer[:, 0], full[:, 3], atol=1e-4)


def test_role_keys():
  assert [r.key for r in T.Role] == ["designer", "agent"]
  assert T.Role.of("agent") is T.Role.AGENT
  assert T.Role.of("designer") is T.Role.DESIGNER
  with pytest.raises(ValueError, match="designer"):
    T.Role.of("critic")
