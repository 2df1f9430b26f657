"""The loop's start is sharded from the first byte (8 fake CPU devices).

Parameters created with `init_sharded_params`, parameters handed over as host
arrays, the optimizer state built beside them, and the engine's own start:
every device holds exactly 1/N of each tensor sharded N ways, and none holds
a whole copy of one.
"""

import jax
import numpy as np
import pytest

from spade import config as config_lib
from spade.model import sharding
from spade.model import transformer
from spade.train import state as state_lib


def _config():
  c = config_lib.base_config()
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, 4, 2
  return c


def _ways(array) -> int:
  """How many distinct pieces the array's sharding cuts it into."""
  spec = array.sharding.spec
  mesh = array.sharding.mesh
  ways = 1
  for entry in spec:
    for name in entry if isinstance(entry, tuple) else (entry,):
      if name is not None:
        ways *= mesh.shape[name]
  return ways


def _check_split(tree) -> int:
  """Asserts 1/N per device for every N-way sharded leaf; returns how many."""
  sharded = 0
  for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    ways = _ways(leaf)
    shards = leaf.addressable_shards
    assert len(shards) == 8, path
    if ways == 1:
      continue
    sharded += 1
    for shard in shards:
      assert shard.data.size * ways == leaf.size, (path, shard.data.shape)
      assert shard.data.shape != leaf.shape, path
    # Each piece lives on 8 / N devices, never more.
    pieces = {tuple((s.start, s.stop) for s in sh.index) for sh in shards}
    assert len(pieces) == ways, path
  return sharded


def _large(tree) -> list:
  """Leaves of 1024+ elements: every weight matrix (not the q/k norm scales,
  whose head_dim axis no rule shards)."""
  return [x for x in jax.tree.leaves(tree) if np.size(x) >= 1024]


def _assert_large_split(tree) -> None:
  large = _large(tree)
  assert large and all(_ways(x) > 1 for x in large)


@pytest.fixture(scope="module")
def setup():
  c = _config()
  mesh = sharding.make_mesh(c.mesh)
  rules = tuple(tuple(r) for r in c.mesh.rules)
  return c, mesh, rules


def test_sharded_init_and_optimizer_state_split_every_matrix(setup):
  c, mesh, rules = setup
  rng = jax.random.PRNGKey(0)
  params = sharding.init_sharded_params(c.model, rng, mesh, rules)
  # Every weight matrix is split (the 259-row vocabulary only over fsdp,
  # which divides its embedding dimension); 1/N on each device.
  _assert_large_split(params)
  split = _check_split(params)
  optimizer = state_lib.make_optimizer(c.optim)
  state = state_lib.create_state(
      params, optimizer, rng=rng, mesh=mesh, rules=rules
  )
  assert _check_split(state.params) == split
  # Adam's two moments are sharded like the parameters.
  assert _check_split(state.opt_state) == 2 * split
  _assert_large_split(state.opt_state)
  for placed, made in zip(
      jax.tree.leaves(state.params), jax.tree.leaves(params)
  ):
    assert placed.sharding == made.sharding
  # The state owns its buffers: the update donates it, the caller keeps its.
  assert not any(x.is_deleted() for x in jax.tree.leaves(params))


def test_host_params_are_placed_shard_by_shard(setup):
  c, mesh, rules = setup
  host = jax.device_get(transformer.init_params(c.model, jax.random.PRNGKey(1)))
  assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(host))
  optimizer = state_lib.make_optimizer(c.optim)
  state = state_lib.create_state(
      host,
      optimizer,
      rng=jax.random.PRNGKey(2),
      mesh=mesh,
      rules=rules,
      keep_reference=True,
  )
  _assert_large_split(state.params)
  assert _check_split(state.ref_params) == _check_split(state.params)
  for placed, value in zip(
      jax.tree.leaves(state.params), jax.tree.leaves(host)
  ):
    np.testing.assert_array_equal(np.asarray(placed), value)
  for ref, value in zip(
      jax.tree.leaves(state.ref_params), jax.tree.leaves(host)
  ):
    np.testing.assert_array_equal(np.asarray(ref), value)
  assert int(state.step) == 0


def test_engine_starts_sharded_with_the_single_device_values():
  from spade.selfplay import engine as engine_lib  # pylint: disable=g-import-not-at-top

  c = _config()
  engine = engine_lib.Engine(c)  # the policy alone: no sandbox
  params = engine.state.params
  _assert_large_split(params)
  assert _check_split(engine.state.opt_state) == 2 * _check_split(params)
  expected = transformer.init_params(c.model, jax.random.PRNGKey(c.seed))
  for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(expected)):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6)


def test_sampling_holds_one_sharded_copy_of_the_weights():
  """The engine unstacks its parameters for the samplers in place of the
  stacks (each stack freed once sliced), keeps each slice sharded as its
  stack was, and restacks them bit for bit with the stacks' shardings when
  the train state is read again."""
  import weakref  # pylint: disable=g-import-not-at-top

  from spade.model import layout  # pylint: disable=g-import-not-at-top
  from spade.selfplay import engine as engine_lib  # pylint: disable=g-import-not-at-top

  c = _config()
  engine = engine_lib.Engine(c)
  stacked = engine.state.params
  want = jax.device_get(stacked)
  shardings = jax.tree.map(lambda x: x.sharding, stacked)
  stacks = [weakref.ref(x) for x in jax.tree.leaves(stacked["layers"])]
  del stacked
  decoding = engine.decode_params()
  assert layout.is_per_layer(decoding)
  assert all(ref() is None for ref in stacks)  # no stack outlives its slices
  _assert_large_split(decoding)
  # Every leaf takes the decoding layout's split (`fitted_param_shardings`):
  # the tables by rows where fsdp x tensor divides the vocabulary (259 bytes
  # do not, so the train state's split on embed, not whole on every chip).
  # The MLP's kernels split over their hidden width (128 over fsdp x
  # tensor = 8), the other layer weights as their stacks were.
  placed = sharding.fitted_param_shardings(decoding, engine.mesh, engine.rules)
  for got, where in zip(jax.tree.leaves(decoding), jax.tree.leaves(placed)):
    assert got.sharding.is_equivalent_to(where, got.ndim), (got.sharding, where)
  assert decoding["embedder"]["input_embedding"].sharding.spec == (
      jax.sharding.PartitionSpec(None, "fsdp")
  )
  up = decoding["layer_0"]["mlp"]["up"]["kernel"]
  assert up.sharding.spec == jax.sharding.PartitionSpec(
      None, ("fsdp", "tensor")
  )
  assert up.addressable_shards[0].data.shape == (64, 16)
  assert engine.decode_params() is decoding  # made once until state is read
  del decoding
  out = engine.sample(
      [[3, 4, 5]], role="agent", max_new_tokens=2, temperature=0.0, seed=0
  )
  assert len(out[0][0]) == 2
  back = engine.state.params
  assert not layout.is_per_layer(back)
  assert jax.tree.structure(back) == jax.tree.structure(want)
  assert jax.tree.map(lambda x: x.sharding, back) == shardings
  for got, value in zip(jax.tree.leaves(back), jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(got), value)


def test_the_kl_reference_is_the_policy_after_the_warm_start():
  """A KL term pulls toward the policy self-play starts from: the
  supervised warm start moves the params, and the reference with them."""
  from spade.environments import ladder  # pylint: disable=g-import-not-at-top
  from spade.selfplay import engine as engine_lib  # pylint: disable=g-import-not-at-top

  c = _config()
  c.optim.designer_kl_coef = 0.1
  c.model.max_len = 384  # a ladder program and its prompt's tail
  c.designer.max_new_tokens = 320
  c.train.warm_start_dir = ladder.TRAIN_DIR
  c.train.warm_start_batch = 8
  engine = engine_lib.Engine(c)
  before = jax.device_get(engine.state.params)
  engine.warm_start([], 1)
  state = engine.state
  moved = [
      float(np.abs(np.asarray(a) - b).max())
      for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(before))
  ]
  assert max(moved) > 0
  assert _check_split(state.ref_params) == _check_split(state.params)
  for ref, now in zip(
      jax.tree.leaves(state.ref_params), jax.tree.leaves(state.params)
  ):
    assert ref is not now  # a copy: the update step donates the params
    np.testing.assert_array_equal(np.asarray(ref), np.asarray(now))
