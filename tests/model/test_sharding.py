"""Mesh construction, logical-axis shardings and a sharded forward pass."""

import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from spade import config as config_lib
from spade.model import architecture
from spade.model import layout
from spade.model import sharding
from spade.model import transformer as T
from tests.model import steps

P = jax.sharding.PartitionSpec


def _mesh_config(data, fsdp, tensor):
  return ml_collections.ConfigDict(dict(data=data, fsdp=fsdp, tensor=tensor))


def test_make_mesh_resolves_minus_one():
  assert jax.device_count() == 8
  mesh = sharding.make_mesh(_mesh_config(-1, 1, 1))
  assert dict(mesh.shape) == {"data": 8, "fsdp": 1, "tensor": 1}
  mesh = sharding.make_mesh(_mesh_config(2, -1, 2))
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
  assert mesh.axis_names == ("data", "fsdp", "tensor")


@pytest.mark.parametrize(
    "sizes, message",
    [
        ((3, -1, 1), "does not divide the 8 devices"),
        ((2, 2, 1), "but there are 8 devices"),
        ((-1, -1, 1), "only one of"),
        ((0, 1, 1), "must be -1 or >= 1"),
    ],
)
def test_make_mesh_rejects_bad_sizes(sizes, message):
  with pytest.raises(ValueError, match=message):
    sharding.make_mesh(_mesh_config(*sizes))


def test_rules_map_logical_axes_to_mesh_axes():
  mesh = sharding.make_mesh(_mesh_config(2, 2, 2))
  rules = config_lib.base_config().mesh.rules
  # A weight: vocab over tensor, embed over fsdp.
  assert sharding.logical_sharding(mesh, rules, "vocab", "embed").spec == P(
      "tensor", "fsdp"
  )
  # An activation: batch takes (data, fsdp) first, so embed stays whole.
  spec = sharding.logical_sharding(mesh, rules, "batch", "length", "embed")
  assert spec.spec == P(("data", "fsdp"), None, None)
  assert sharding.batch_sharding(mesh, rules, 2).spec == P(
      ("data", "fsdp"), None
  )


def test_decoding_tables_split_by_rows_where_the_vocabulary_divides():
  """The decoding layout's tables take "decode_vocab" (fsdp x tensor), rows
  whole; a vocabulary those axes do not divide keeps the train state's
  split instead of going whole; rules without "decode_vocab" get it."""
  mesh = sharding.make_mesh(_mesh_config(2, 2, 2))
  rules = config_lib.base_config().mesh.rules

  def tables(vocab, rules):
    cfg = config_lib.base_config().model
    cfg.num_layers, cfg.vocab_size = 2, vocab
    params = T.init_params(cfg, jax.random.key(0))
    stacked = sharding.fitted_param_shardings(params, mesh, rules)
    decoding = sharding.fitted_param_shardings(
        layout.to_per_layer_layout(params, cfg), mesh, rules
    )
    pick = lambda t: t["embedder"]["input_embedding"].spec
    return pick(stacked), pick(decoding)

  assert tables(512, rules) == (
      P("tensor", "fsdp"),
      P(("fsdp", "tensor"), None),
  )
  assert tables(259, rules) == (P(None, "fsdp"), P(None, "fsdp"))
  older = [r for r in rules if r[0] != "decode_vocab"]
  assert len(older) == len(rules) - 1
  assert tables(512, older)[1] == P(("fsdp", "tensor"), None)


@pytest.fixture(scope="module")
def tiny():
  cfg = config_lib.base_config().model
  cfg.num_layers = 3
  cfg.sliding_window = 4
  cfg.global_every = 3
  return cfg, T.init_params(cfg, jax.random.key(0))


def test_shard_params_places_every_leaf(tiny):
  cfg, params = tiny
  mesh = sharding.make_mesh(_mesh_config(2, 2, 2))
  rules = config_lib.base_config().mesh.rules
  placed = sharding.shard_params(params, mesh, rules)
  q = placed["layers"]["block_0"]["attn"]["q_proj"]["kernel"]  # [1, 64, 4, 16]
  assert q.sharding.spec == P(None, "fsdp", "tensor", None)
  assert q.addressable_shards[0].data.shape == (1, 32, 2, 16)
  # 259 does not split over tensor=2: the vocab axis falls back to replicated.
  emb = placed["embedder"]["input_embedding"]
  assert emb.sharding.spec == P(None, "fsdp")
  assert emb.addressable_shards[0].data.shape == (cfg.vocab_size, 32)
  for a, b in zip(jax.tree.leaves(placed), jax.tree.leaves(params)):
    np.testing.assert_array_equal(a, b)


def test_sharded_forward_matches_single_device(tiny):
  """data=2, fsdp=2, tensor=2 over 8 fake devices: same logits (1e-5)."""
  cfg, params = tiny
  model = T.build_model(cfg)
  tokens = jax.random.randint(jax.random.key(1), (4, 12), 0, 259)
  positions = jnp.broadcast_to(jnp.arange(12), tokens.shape)

  def forward(params, tokens, positions):
    return model.apply({"params": params}, tokens, positions, T.Role.AGENT)[0]

  single = jax.jit(forward)(params, tokens, positions)

  mesh = sharding.make_mesh(_mesh_config(2, 2, 2))
  rules = config_lib.base_config().mesh.rules
  placed = sharding.shard_params(params, mesh, rules)
  batch = sharding.batch_sharding(mesh, rules, 2)
  with sharding.use_rules(mesh, rules):
    sharded_fn = jax.jit(
        forward,
        in_shardings=(
            sharding.fitted_param_shardings(params, mesh, rules),
            batch,
            batch,
        ),
    )
    sharded = sharded_fn(placed, tokens, positions)
  assert sharded.sharding.spec[0] == ("data", "fsdp")
  np.testing.assert_allclose(sharded, single, atol=1e-5)


def test_init_sharded_params_equals_single_device_init(tiny):
  cfg, params = tiny
  mesh = sharding.make_mesh(_mesh_config(2, 2, 2))
  rules = config_lib.base_config().mesh.rules
  placed = sharding.init_sharded_params(cfg, jax.random.key(0), mesh, rules)
  down = placed["layers"]["block_0"]["mlp"]["down"]["kernel"]  # [1, 128, 64]
  assert down.sharding.spec == P(None, "tensor", "fsdp")
  for a, b in zip(jax.tree.leaves(placed), jax.tree.leaves(params)):
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_decoding_mlp_kernels_split_over_the_hidden_width():
  """The decoding layout's MLP kernels take "decode_mlp" (fsdp x tensor) on
  their hidden width, in either kernel layout; a width those axes do not
  divide keeps the train split; rules without "decode_mlp" get it."""
  mesh = sharding.make_mesh(_mesh_config(2, 2, 2))
  rules = config_lib.base_config().mesh.rules

  def kernels(mlp_dim, rules, kernel_layout="in_out"):
    cfg = config_lib.base_config().model
    cfg.num_layers, cfg.mlp_dim, cfg.kernel_layout = 2, mlp_dim, kernel_layout
    params = layout.to_per_layer_layout(
        T.init_params(cfg, jax.random.key(0)), cfg
    )
    mlp = sharding.fitted_param_shardings(params, mesh, rules)["layer_1"]["mlp"]
    return {k: next(iter(v.values())).spec for k, v in mlp.items()}

  both = ("fsdp", "tensor")
  assert kernels(96, rules) == {
      "gate": P(None, both),
      "up": P(None, both),
      "down": P(both, None),
  }
  assert kernels(96, rules, "out_in") == {
      "gate": P(both, None),
      "up": P(both, None),
      "down": P(None, both),
  }
  # 6 over fsdp x tensor = 4 does not divide: the train split, not whole.
  assert kernels(6, rules) == {
      "gate": P("fsdp", "tensor"),
      "up": P("fsdp", "tensor"),
      "down": P("tensor", "fsdp"),
  }
  older = [r for r in rules if r[0] != "decode_mlp"]
  assert len(older) == len(rules) - 1
  assert kernels(96, older)["up"] == P(None, both)


def _summed_shapes(hlo: str) -> set[str]:
  """The result shapes of a compiled program's cross-chip sums (each of a
  combined sum's results)."""
  ops = re.findall(
      r"= (\(.*?\)|\S+) (?:all-reduce|reduce-scatter)(?:-start)?\(", hlo
  )
  return {s for op in ops for s in re.findall(r"\w+\[[\d,]*\]", op)}


def _one_token_step(cfg, rules=None, mesh_sizes=(2, 2, 2), rows=8):
  """`steps.one_token_step` over `mesh_sizes` under `rules` (the base
  config's), with the sharded program's HLO text."""
  mesh = sharding.make_mesh(_mesh_config(*mesh_sizes))
  rules = rules or config_lib.base_config().mesh.rules
  return steps.one_token_step(cfg, rules, mesh, rows)


def test_decoding_kv_projections_split_over_the_cache_heads():
  """The decoding layout's key and value kernels split their KV heads over
  tensor, as the cache does ("cache_heads"): a one-token step sums each
  chip's own head's keys and values (f32[rows, 1, head_dim]), never
  both heads' (every chip making every head's), and its logits equal one
  device's. Query heads stay as trained; one KV head (tensor does not
  divide it) keeps the train split."""
  mesh = sharding.make_mesh(_mesh_config(2, 2, 2))
  rules = config_lib.base_config().mesh.rules
  cfg = config_lib.base_config().model
  cfg.num_layers, cfg.num_heads = 2, 8  # 4 query heads a chip, 2 KV heads
  params = layout.to_per_layer_layout(
      T.init_params(cfg, jax.random.key(0)), cfg
  )
  attn = sharding.fitted_param_shardings(params, mesh, rules)["layer_1"]["attn"]
  specs = {k: v["kernel"].spec for k, v in attn.items() if "kernel" in v}
  assert specs["k_proj"] == specs["v_proj"] == P("fsdp", "tensor", None)
  assert specs["q_proj"] == P("fsdp", "tensor", None)
  single, sharded, hlo = _one_token_step(cfg)
  np.testing.assert_allclose(sharded, single, atol=1e-5)
  summed = _summed_shapes(hlo)
  h = cfg.head_dim
  assert any(s.endswith(f",1,{h}]") for s in summed), summed
  assert not any(s.endswith(f",2,{h}]") for s in summed), summed
  cfg.num_kv_heads = 1
  one = layout.to_per_layer_layout(T.init_params(cfg, jax.random.key(0)), cfg)
  attn = sharding.fitted_param_shardings(one, mesh, rules)["layer_1"]["attn"]
  assert attn["k_proj"]["kernel"].spec == P("fsdp", None, None)


def test_one_token_step_sums_down_only_not_the_mlp_hidden():
  """A one-token step on the decoding layout (2x2x2 mesh, rows moving to the
  weights): the MLP's hidden stays split where gate and up made it, so no
  cross-chip sum has its width (96), only down's [rows, embed]; and the
  logits equal one device's."""
  cfg = config_lib.base_config().model
  cfg.num_layers, cfg.mlp_dim = 2, 96
  single, sharded, hlo = _one_token_step(cfg)
  np.testing.assert_allclose(sharded, single, atol=1e-5)
  summed = _summed_shapes(hlo)
  assert any(",64]" in s for s in summed), summed  # down's partial sums
  assert not any("96" in s for s in summed), summed


def test_one_token_step_with_down_on_the_train_split():
  """A tensor-axis pod config's rules (`config.tpu_pod_config`): down
  contracts the hidden over tensor only and keeps its output split over
  fsdp, so no cross-chip sum is as wide as the embedding (64), only
  [rows, embed / fsdp] (32); the logits equal one device's."""
  pod = config_lib.tpu_pod_config(
      {}, fsdp=2, tensor=2, checkpoint_kind="none", tokenizer_kind="bytes",
      variant="", config_file="test",
  )  # fmt: skip
  rules = dict(pod.mesh.rules)
  assert (rules["decode_down"], rules["decode_embed"]) == ("tensor", "fsdp")
  cfg = config_lib.base_config().model
  cfg.num_layers, cfg.mlp_dim = 2, 96
  single, sharded, hlo = _one_token_step(cfg, pod.mesh.rules)
  np.testing.assert_allclose(sharded, single, atol=1e-5)
  summed = _summed_shapes(hlo)
  assert any(s.endswith(",32]") for s in summed), summed
  assert not any(s.endswith(",64]") for s in summed), summed
  assert not any("96" in s for s in summed), summed


def test_one_token_step_keeps_the_residual_where_the_projections_meet_it():
  """A tensor-axis pod config's rules name "decode_residual" (fsdp): a
  one-token step keeps the residual stream with its rows whole and its
  width split over fsdp (`layers.residual`), where the query, key and
  value projections take it and the attention's output and down leave
  it, so its rows never move between layouts (no all-to-all; the norms
  sum their squares across fsdp, f32[rows, 1]). With the rule left out
  (the layout the train step keeps) the same step moves them at every
  projection, as it does on fewer rows than half of
  `model.decode_mlp_pad_rows` (8 rows under 32). The logits equal one
  device's every way."""
  pod = config_lib.tpu_pod_config(
      {}, fsdp=2, tensor=2, checkpoint_kind="none", tokenizer_kind="bytes",
      variant="", config_file="test",
  )  # fmt: skip
  assert dict(pod.mesh.rules)["decode_residual"] == "fsdp"
  without = tuple(r for r in pod.mesh.rules if r[0] != "decode_residual")
  cfg = config_lib.base_config().model
  cfg.num_layers, cfg.mlp_dim = 2, 96
  moves = {}
  for name, rules, pad in (
      ("kept", pod.mesh.rules, 0),
      ("train", without, 0),
      ("few rows", pod.mesh.rules, 32),
  ):
    cfg.decode_mlp_pad_rows = pad
    single, sharded, hlo = _one_token_step(cfg, rules)
    np.testing.assert_allclose(sharded, single, atol=1e-5)
    moves[name] = len(re.findall(r" all-to-all(?:-start)?\(", hlo))
    if name == "kept":
      assert "f32[4,1]" in _summed_shapes(hlo), _summed_shapes(hlo)
  # (The one left is in the output layer, moving its logits.)
  assert moves["kept"] <= 1, moves
  assert moves["train"] >= 2 * cfg.num_layers, moves
  assert moves["few rows"] == moves["train"], moves


def test_one_token_steps_mlp_runs_on_rows_padded_to_the_multiple():
  """`model.decode_mlp_pad_rows` (the tensor-axis pod configs' 128, here
  16): a one-token step on 12 rows over 4 row shards (3 a shard) runs its
  MLP on 16 (4 a shard, each shard's pad at its end), so its matmuls are
  [16, ...]; the logits equal one device's, and those of the same step
  without the pad. 8 rows (half of 16) are padded too, 4 are not."""
  pod = config_lib.tpu_pod_config(
      {}, fsdp=2, tensor=2, checkpoint_kind="none", tokenizer_kind="bytes",
      variant="", config_file="test",
  )  # fmt: skip
  assert pod.model.decode_mlp_pad_rows == 128
  cfg = config_lib.base_config().model
  cfg.num_layers, cfg.mlp_dim = 2, 96
  _, plain, plain_hlo = _one_token_step(cfg, pod.mesh.rules, rows=12)
  cfg.decode_mlp_pad_rows = 16
  single, sharded, hlo = _one_token_step(cfg, pod.mesh.rules, rows=12)
  np.testing.assert_allclose(sharded, single, atol=1e-5)
  np.testing.assert_allclose(sharded, plain, atol=1e-6)
  # A chip's MLP hidden (the 96-wide hidden over tensor: 48) on its data
  # shard's rows: 8 of the padded 16, not 6 of the 12.
  assert re.search(r"\[8,48\]", hlo), "the MLP did not run on 16 rows"
  assert re.search(r"\[6,48\]", plain_hlo)
  assert not re.search(r"\[8,48\]", plain_hlo)
  *_, four = _one_token_step(cfg, pod.mesh.rules, rows=4)
  assert re.search(r"\[2,48\]", four) and not re.search(r"\[8,48\]", four)
  *_, eight = _one_token_step(cfg, pod.mesh.rules, rows=8)
  assert re.search(r"\[8,48\]", eight), "8 rows (half of 16) not padded"


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_decode_mlp_pad_rows_takes_a_count(bad):
  with pytest.raises(ValueError, match="decode_mlp_pad_rows"):
    architecture.ModelConfig.from_config({"decode_mlp_pad_rows": bad})
