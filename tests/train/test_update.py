"""The jitted, sharded update step on the tiny model and 8 fake CPU devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade import config as config_lib
from spade.model import sharding
from spade.model import transformer
from spade.train import losses
from spade.train import state as state_lib
from spade.train import update

ROWS, LENGTH = 8, 16
ROLES = {"designer": transformer.Role.DESIGNER, "agent": transformer.Role.AGENT}


def _config(**optim):
  c = config_lib.base_config()
  c.optim.learning_rate = 1e-3
  for k, v in optim.items():
    c.optim[k] = v
  return c


def _mesh(c, data, fsdp, tensor):
  m = c.mesh.copy_and_resolve_references()
  m.data, m.fsdp, m.tensor = data, fsdp, tensor
  return sharding.make_mesh(m, jax.devices()[: data * fsdp * tensor])


@pytest.fixture(scope="module")
def setup():
  """Params, the host logprob function and a batch for both roles."""
  c = _config()
  model = transformer.build_model(c.model)
  params = jax.device_get(
      transformer.init_params(c.model, jax.random.PRNGKey(0))
  )

  @jax.jit
  def logprobs(params, tokens, positions, input_mask, role_is_agent):
    def run(role):
      logits, _ = model.apply(
          {"params": params}, tokens, positions, role, input_mask=input_mask
      )
      return losses.token_logprobs(logits, tokens)

    return jax.lax.cond(
        role_is_agent,
        lambda: run(transformer.Role.AGENT),
        lambda: run(transformer.Role.DESIGNER),
    )

  rng = np.random.default_rng(1)
  batch, new_logprobs = {}, {}
  for name, role in ROLES.items():
    tokens = rng.integers(0, 256, size=(ROWS, LENGTH)).astype(np.int32)
    lengths = rng.integers(8, LENGTH + 1, size=ROWS)
    input_mask = np.arange(LENGTH)[None, :] < lengths[:, None]
    positions = np.where(input_mask, np.arange(LENGTH)[None, :], 0)
    positions = positions.astype(np.int32)
    # Completion: from position 4 to the end of each row.
    loss_mask = input_mask & (np.arange(LENGTH)[None, :] >= 4)
    lp = np.asarray(
        logprobs(params, tokens, positions, input_mask, role == ROLES["agent"])
    )
    noise = rng.normal(scale=0.3, size=lp.shape).astype(np.float32)
    weights = np.ones(ROWS, np.float32)
    weights[-1] = 0.0  # a padding row
    batch[name] = {
        "tokens": tokens,
        "positions": positions,
        "input_mask": input_mask,
        "loss_mask": loss_mask,
        "old_logprobs": np.where(loss_mask, lp + noise, 0.0).astype(np.float32),
        "advantages": rng.normal(size=ROWS).astype(np.float32),
        "weights": weights,
    }
    new_logprobs[name] = lp
  return dict(
      config=c,
      model=model,
      params=params,
      batch=batch,
      new_logprobs=new_logprobs,
      logprobs=logprobs,
  )


def _state(setup, config, mesh, seed=3):
  """(optimizer, the step-0 state of `setup`'s params) as `config` asks."""
  optimizer = state_lib.make_optimizer(config.optim)
  state = state_lib.create_state(
      setup["params"],
      optimizer,
      rng=jax.random.PRNGKey(seed),
      mesh=mesh,
      rules=config.mesh.rules,
      keep_reference=state_lib.keeps_reference(config),
      lora_rank=config.optim.lora_rank,
  )
  return optimizer, state


def _one_step(setup, config, mesh, model=None):
  optimizer, state = _state(setup, config, mesh)
  step = update.make_update_step(
      model or setup["model"], optimizer, mesh, config
  )
  new_state, metrics = step(state, setup["batch"])
  return state, new_state, jax.device_get(metrics)


def _expected_pg_loss(setup, name, config):
  """The clipped surrogate recomputed in numpy from the host logprobs."""
  sub = setup["batch"][name]
  lp = setup["new_logprobs"][name]
  ratio = np.exp(lp - sub["old_logprobs"])
  adv = sub["advantages"][:, None]
  lo, hi = 1 - config.optim.clip_low, 1 + config.optim.clip_high
  per_token = np.maximum(-adv * ratio, -adv * np.clip(ratio, lo, hi))
  w = sub["loss_mask"] * sub["weights"][:, None]
  w[:, 0] = 0
  clipped = (-adv * np.clip(ratio, lo, hi) > -adv * ratio).astype(float)
  return (
      (per_token * w).sum() / w.sum(),
      (ratio * w).sum() / w.sum(),
      (clipped * w).sum() / w.sum(),
  )


@pytest.mark.slow
def test_update_matches_numpy_losses_and_moves_params(setup):
  c = setup["config"]
  # Both roles PPO-clipped, as numpy computes.
  c.optim.designer_tis = c.optim.agent_tis = False
  mesh = _mesh(c, 2, 2, 2)
  old, new, m = _one_step(setup, c, mesh)
  c.optim.designer_tis = c.optim.agent_tis = True
  for name in ROLES:
    loss, ratio_mean, clip_frac = _expected_pg_loss(setup, name, c)
    assert m[f"train/{name}_pg_loss"] == pytest.approx(loss, abs=2e-5)
    assert m[f"train/{name}_ratio_mean"] == pytest.approx(ratio_mean, 1e-4)
    assert m[f"train/{name}_clip_frac"] == pytest.approx(clip_frac, abs=1e-6)
    assert 0 < clip_frac < 1  # the noise puts some tokens outside the band
  total = m["train/designer_loss"] + m["train/agent_loss"]
  assert m["train/loss"] == pytest.approx(total, rel=1e-5)
  assert m["train/grad_norm"] > 0
  assert int(new.step) == 1
  # The state was donated: its buffers now belong to the new state.
  assert jax.tree.leaves(old.params)[0].is_deleted()
  moved = jax.tree.map(
      lambda a, b: float(np.abs(np.asarray(a) - b).max()),
      new.params,
      setup["params"],
  )
  assert min(jax.tree.leaves(moved)) > 0  # Adam moves every parameter
  # Parameters stay sharded as the rules say: mlp kernels over fsdp x tensor.
  gate = new.params["layers"]["block_0"]["mlp"]["gate"]["kernel"]
  assert gate.sharding.spec == jax.sharding.PartitionSpec(
      None, "fsdp", "tensor"
  )


@pytest.mark.slow  # ~35 s of CPU: two sharded compilations with KL
def test_one_device_equals_eight_devices_with_kl_and_delay():
  """Params after one step agree on a 1-device and a 2x2x2 mesh."""
  # Its own setup (module fixtures are shared with other tests, and both
  # steps here donate their states).
  # lr 1e-4: Adam's first step is ~lr * sign(g), so where |g| is near its eps
  # float reassociation across devices shows up scaled by lr.
  # No further designer_delay: designer rows take truncated importance
  # weights by default (optim.designer_tis, the reference's --use-tis).
  c = _config(learning_rate=1e-4, kl_coef=0.1, max_importance_weight=1.2)
  params = jax.device_get(
      transformer.init_params(c.model, jax.random.PRNGKey(0))
  )
  rng = np.random.default_rng(5)
  batch = {}
  for name in ROLES:
    tokens = rng.integers(0, 256, size=(ROWS, LENGTH)).astype(np.int32)
    mask = np.ones((ROWS, LENGTH), bool)
    loss_mask = np.zeros((ROWS, LENGTH), bool)
    loss_mask[:, 6:] = True
    batch[name] = {
        "tokens": tokens,
        "input_mask": mask,
        "loss_mask": loss_mask,
        # Sampler logprobs near the model's (~log 1/259): ratios around 1.
        "old_logprobs": (
            rng.normal(-5.6, 0.3, (ROWS, LENGTH)).astype(np.float32)
        ),
        "advantages": rng.normal(size=ROWS).astype(np.float32),
        "weights": np.ones(ROWS, np.float32),
    }
  model = transformer.build_model(c.model)
  results = []
  for shape in ((1, 1, 1), (2, 2, 2)):
    mesh = _mesh(c, *shape)
    optimizer = state_lib.make_optimizer(c.optim)
    state = state_lib.create_state(
        params,
        optimizer,
        rng=jax.random.PRNGKey(3),
        mesh=mesh,
        rules=c.mesh.rules,
        keep_reference=True,
    )
    step = update.make_update_step(model, optimizer, mesh, c)
    state, metrics = step(state, batch)
    params_1 = jax.device_get(state.params)
    # A second step: the KL term is zero at the reference, non-zero after.
    # (Only one step is compared: Adam divides by sqrt(v), so a gradient
    # entry near 0 turns float reassociation noise into larger differences.)
    state, metrics2 = step(state, batch)
    results.append((params_1, jax.device_get(metrics), metrics2))
  (p1, m1, m1b), (p8, m8, m8b) = results
  jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=0),
      p1,
      p8,
  )
  for k in m1:
    assert m1[k] == pytest.approx(m8[k], rel=1e-4, abs=1e-6), k
  assert m1["train/agent_kl"] == pytest.approx(0.0, abs=1e-7)
  assert float(m8b["train/agent_kl"]) > 0
  # Both roles' rows: truncated importance weights (slime's --use-tis on
  # every sample), some cut at 1.2.
  for name in ROLES:
    assert 0 < m8[f"train/{name}_is_truncated_frac"] < 1
    assert m8[f"train/{name}_is_weight_mean"] <= 1.2
  # The reference stays frozen while the params move.
  moved = np.abs(np.asarray(p8["final_norm"]["scale"]) - 1.0).max()
  assert moved > 5e-5


def test_loss_ignores_tokens_after_the_completion(setup):
  """Causality + mask: later tokens cannot reach the sampled tokens' loss."""
  sub = setup["batch"]["agent"]
  # Row 0 read as prompt [0, 4), completion [4, 10), later text [10, L).
  tokens = sub["tokens"].copy()
  positions = np.arange(LENGTH, dtype=np.int32)[None, :]
  args = (positions, np.ones((1, LENGTH), bool), True)
  base = np.asarray(setup["logprobs"](setup["params"], tokens[:1], *args))
  later = tokens[:1].copy()
  later[0, 10:] = (later[0, 10:] + 7) % 256
  after = np.asarray(setup["logprobs"](setup["params"], later, *args))
  np.testing.assert_array_equal(after[0, :10], base[0, :10])
  earlier = tokens[:1].copy()
  earlier[0, 2] = (earlier[0, 2] + 7) % 256
  changed = np.asarray(setup["logprobs"](setup["params"], earlier, *args))
  assert np.abs(changed[0, 4:10] - base[0, 4:10]).max() > 1e-6


@pytest.mark.slow
def test_sft_step_lowers_the_loss(setup):
  c = _config(learning_rate=1e-2)
  mesh = _mesh(c, 2, 2, 2)
  optimizer = state_lib.make_optimizer(c.optim)
  state = state_lib.create_state(
      setup["params"],
      optimizer,
      rng=jax.random.PRNGKey(0),
      mesh=mesh,
      rules=c.mesh.rules,
  )
  step = update.make_sft_step(setup["model"], optimizer, mesh, c)
  keys = ("tokens", "input_mask", "loss_mask", "weights")
  batch = {n: {k: setup["batch"][n][k] for k in keys} for n in ROLES}
  nll = []
  for _ in range(3):
    state, m = step(state, batch)
    nll.append(float(m["train/agent_nll"]) + float(m["train/designer_nll"]))
  assert nll[0] > nll[1] > nll[2]
  assert nll[0] == pytest.approx(2 * np.log(259), rel=0.1)


def test_bad_batches_say_what_to_do(setup):
  c = setup["config"]
  mesh = _mesh(c, 2, 2, 2)
  optimizer = state_lib.make_optimizer(c.optim)
  step = update.make_update_step(setup["model"], optimizer, mesh, c)
  odd = {
      "agent": {k: v[:3] for k, v in setup["batch"]["agent"].items()},
  }
  with pytest.raises(ValueError, match="multiple of the mesh"):
    step(None, odd)
  missing = {"agent": {"tokens": setup["batch"]["agent"]["tokens"]}}
  with pytest.raises(ValueError, match="make_batch"):
    step(None, missing)
  with pytest.raises(ValueError, match="'designer' and/or 'agent'"):
    step(None, {"critic": {}})
  kl = _config(kl_coef=0.1)
  kl_step = update.make_update_step(setup["model"], optimizer, mesh, kl)
  no_ref = state_lib.TrainState(
      params=setup["params"], opt_state=(), step=0, rng=0, ref_params=None
  )
  with pytest.raises(ValueError, match="keep_reference=True"):
    kl_step(no_ref, setup["batch"])


@pytest.mark.slow
def test_microbatches_and_remat_give_the_same_step(setup):
  """Accumulating over micro-batches with per-layer remat, with or without
  recomputing each micro-batch's forward, changes nothing."""
  mesh_c = _config()
  mesh = _mesh(mesh_c, 2, 1, 1)
  outs = []
  for microbatch_rows, remat, microbatch_remat in (
      (0, "none", True),
      (2, "full", True),
      (2, "full", False),
  ):
    # Adam's first step is about lr * sign(g): a gradient near its eps
    # turns float rounding-order differences into a large part of a step
    # (1.1e-5 at lr 1e-4 on one weight of the shared output layer). An eps
    # of 1e-6 keeps steps of gradients that small proportional to them; the
    # comparison still sees a wrong step (updates are up to 1e-4).
    c = _config(
        microbatch_rows=microbatch_rows,
        microbatch_remat=microbatch_remat,
        learning_rate=1e-4,
        eps=1e-6,
    )
    c.model.remat = remat
    _, new_state, metrics = _one_step(
        setup, c, mesh, transformer.build_model(c.model)
    )
    outs.append((jax.device_get(new_state.params), metrics))
  (p0, m0), *rest = outs
  for p1, m1 in rest:
    for key in (
        "train/loss", "train/agent_pg_loss", "train/designer_clip_frac"
    ):  # fmt: skip
      np.testing.assert_allclose(m1[key], m0[key], rtol=1e-5, atol=1e-6)
    assert m1["train/agent_num_tokens"] == m0["train/agent_num_tokens"]
    for a, b in zip(jax.tree.leaves(p0), jax.tree.leaves(p1)):
      np.testing.assert_allclose(a, b, atol=1e-5)


def _on_policy_batch(setup):
  """The setup batch with old logprobs equal to the params' own: ratio 1."""
  return {
      name: dict(
          sub,
          old_logprobs=np.where(
              sub["loss_mask"], setup["new_logprobs"][name], 0.0
          ).astype(np.float32),
      )
      for name, sub in setup["batch"].items()
  }


def _run(setup, config, mesh, batch, calls=1):
  optimizer = state_lib.make_optimizer(config.optim)
  state = state_lib.create_state(
      setup["params"],
      optimizer,
      rng=jax.random.PRNGKey(3),
      mesh=mesh,
      rules=config.mesh.rules,
  )
  step = update.make_update_step(setup["model"], optimizer, mesh, config)
  metrics = []
  for _ in range(calls):
    state, m = step(state, batch)
    metrics.append(jax.device_get(m))
  return state, metrics


@pytest.mark.slow
def test_epochs_make_the_clip_bind(setup):
  """On-policy data: one step never clips; later steps of one batch do."""
  batch = _on_policy_batch(setup)
  mesh = _mesh(setup["config"], 2, 1, 1)
  _, (one,) = _run(setup, _config(learning_rate=1e-2), mesh, batch)
  assert one["train/optimizer_steps"] == 1
  for name in ROLES:
    assert one[f"train/{name}_clip_frac"] == 0.0
    assert one[f"train/{name}_ratio_mean"] == pytest.approx(1.0, abs=1e-5)
  c = _config(learning_rate=1e-2, epochs=2, num_minibatches=2)
  state, (four,) = _run(setup, c, mesh, batch)
  assert four["train/optimizer_steps"] == 4
  assert int(state.step) == 4
  for name in ROLES:
    assert four[f"train/{name}_clip_frac"] > 0
    assert four[f"train/{name}_approx_kl"] > 0
    # num_tokens counts one pass over the batch, not one per epoch.
    assert four[f"train/{name}_num_tokens"] == one[f"train/{name}_num_tokens"]


@pytest.mark.slow
def test_two_epochs_equal_two_single_steps(setup):
  """epochs=2 of the whole batch == two calls of the one-step update."""
  mesh = _mesh(setup["config"], 2, 1, 1)
  batch = setup["batch"]
  s_two, (m_two,) = _run(setup, _config(epochs=2), mesh, batch)
  s_one, (m_a, m_b) = _run(setup, _config(), mesh, batch, calls=2)
  assert int(s_two.step) == int(s_one.step) == 2
  for a, b in zip(
      jax.tree.leaves(jax.device_get(s_two.params)),
      jax.tree.leaves(jax.device_get(s_one.params)),
  ):
    np.testing.assert_allclose(a, b, atol=1e-6)
  for key in ("train/loss", "train/agent_clip_frac", "train/grad_norm"):
    np.testing.assert_allclose(
        m_two[key], (m_a[key] + m_b[key]) / 2, rtol=1e-5, atol=1e-7
    )


def test_minibatches_must_divide_the_rows(setup):
  c = _config(num_minibatches=3)
  mesh = _mesh(c, 2, 1, 1)
  with pytest.raises(ValueError, match="num_minibatches=3"):
    _run(setup, c, mesh, setup["batch"])


def test_summed_microbatches_add_up_to_the_whole_batch():
  rng = np.random.default_rng(0)
  sub = {
      "tokens": np.zeros((4, 6), np.int32),
      "values": rng.normal(size=(4, 6)).astype(np.float32),
      "loss_mask": rng.random((4, 6)) > 0.3,
      "weights": np.full(4, 0.25, np.float32),
  }

  def loss_of(mb):
    loss = losses.sample_sum(mb["values"], mb["loss_mask"], mb["weights"])
    return loss, {"num_tokens": jnp.sum(mb["loss_mask"]).astype(jnp.float32)}

  whole, _ = loss_of(sub)
  split, _ = update._microbatched(loss_of, sub, 2, summed=True)  # pylint: disable=protected-access
  np.testing.assert_allclose(float(split), float(whole), rtol=1e-6)
  weighted = update.sample_weights({"agent": sub}, samples=8)
  np.testing.assert_allclose(weighted["agent"]["weights"], 0.25 / 8)


def test_designer_kl_coef_weighs_the_designers_rows_only(setup):
  """`optim.designer_kl_coef` adds a KL term to the designer's rows and
  leaves the agent's loss its policy loss; both roles' KL is measured
  against the same reference."""
  # Each role's token mean: the loss is then pg_loss + coef x kl.
  c = _config(designer_kl_coef=0.5, epochs=1, loss_reduction="token_mean")
  mesh = _mesh(c, 1, 1, 1)
  optimizer, state = _state(setup, c, mesh)
  assert state.ref_params is not None
  # A reference away from the params: the KL is not zero at step 0.
  state = state.replace(
      ref_params=jax.tree.map(lambda x: x * 1.05, state.ref_params)
  )
  step = update.make_update_step(setup["model"], optimizer, mesh, c)
  _, m = step(state, setup["batch"])
  m = jax.device_get(m)
  assert m["train/designer_kl"] > 1e-6
  assert m["train/designer_loss"] == pytest.approx(
      m["train/designer_pg_loss"] + 0.5 * m["train/designer_kl"], rel=1e-5
  )
  assert m["train/agent_kl"] == 0.0
  assert m["train/agent_loss"] == pytest.approx(m["train/agent_pg_loss"])
  assert not state_lib.keeps_reference(_config())
