"""The one jitted, sharded, donated update of the shared parameters.

`make_update_step` returns `update_fn(state, batch) -> (state, metrics)`:
`config.optim.epochs` x `config.optim.num_minibatches` optimizer steps (one
by default, as the reference takes per rollout) on the sum of the designer's
and the agent's policy losses.
Both roles run the same model (`spade.model.transformer`), each sub-batch
through its role's head (`transformer.head_name`: the one shared output layer
by default, the role's own with `config.model.separate_heads`), so one
gradient carries both. `make_sft_step` is the supervised (warm-start)
variant.

Batch layout, per role (`batch["designer"]`, `batch["agent"]`), as produced by
`spade.selfplay.batching.make_batch`; every array is aligned with `tokens`:

  tokens        int32[B, L]
  positions     int32[B, L]   optional; derived from input_mask when absent
  input_mask    bool[B, L]    False on padding
  loss_mask     bool[B, L]    True on sampled tokens only
  old_logprobs  f32[B, L]     the sampler's logprob of each sampled token
  advantages    f32[B]
  weights       f32[B]        0 for padding rows

B must be a multiple of the mesh's batch-axis size (the "batch" rule of
`config.mesh.rules`). The SFT batch needs only tokens, input_mask, loss_mask
and weights.

The step is partially applied and jitted once with NamedShardings for the
state (parameters by their logical axes, see `spade.train.state`) and the
batch (rows split over the batch axes), and donates the state, so the old
parameters' memory is reused for the new ones: the state passed in is dead
after the call.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from spade.model import mesh_fit
from spade.model import sharding
from spade.model import transformer
from spade.train import lora
from spade.train import losses
from spade.train import state as state_lib

Batch = Mapping[str, Mapping[str, jax.Array]]
Metrics = dict[str, jax.Array]
UpdateFn = Callable[[state_lib.TrainState, Batch], tuple[Any, Metrics]]

_POLICY_KEYS = (
    "tokens",
    "input_mask",
    "loss_mask",
    "old_logprobs",
    "advantages",
    "weights",
)
_SFT_KEYS = ("tokens", "input_mask", "loss_mask", "weights")


def lora_scale(optim_config: ml_collections.ConfigDict) -> float:
  """s = lora_alpha / lora_rank, the adapters' product's factor (0: off)."""
  rank = optim_config.lora_rank
  return optim_config.lora_alpha / rank if rank > 0 else 0.0


def _rules(config: ml_collections.ConfigDict) -> tuple:
  return tuple(
      (name, tuple(axes) if isinstance(axes, list) else axes)
      for name, axes in config.mesh.rules
  )


def batch_axes(config: ml_collections.ConfigDict) -> tuple[str, ...]:
  """Mesh axes the batch dimension is split over (the "batch" rule)."""
  for name, axes in _rules(config):
    if name == "batch":
      return mesh_fit.axis_names(axes)
  return ()


def _positions(sub: Mapping[str, jax.Array]) -> jax.Array:
  if "positions" in sub:
    return sub["positions"]
  mask = sub["input_mask"].astype(jnp.int32)
  return jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)


def _logprobs(model, params, sub, role, chunk: int = 256) -> jax.Array:
  """Log-probability of each token given the ones before it (column 0: 0).

  The same values as `losses.token_logprobs(logits, tokens)` wherever
  `sub["loss_mask"]` is set, computed by the model in position chunks so the
  full [B, L, V] logits never exist; a chunk of positions the loss does not
  read (a long prompt) is skipped and gives 0.
  """
  tokens = sub["tokens"]
  targets = jnp.pad(tokens[:, 1:], ((0, 0), (0, 1)))
  # Position t scores token t + 1: only where the loss reads it.
  needed = jnp.pad(sub["loss_mask"][:, 1:].astype(bool), ((0, 0), (0, 1)))
  logp, _ = model.apply(
      lora.variables(params),
      tokens,
      _positions(sub),
      role,
      input_mask=sub["input_mask"].astype(bool),
      targets=targets,
      chunk=chunk,
      score_mask=needed,
  )
  return jnp.pad(logp[:, :-1], ((0, 0), (1, 0)))


def sample_weights(batch: Batch, samples: int) -> Batch:
  """The batch with each real row's weight divided by `samples` (the
  batch's samples of both roles, those without signal included:
  `selfplay.score.update_rows`), for `optim.loss_reduction="sample_mean"`:
  slime divides the sum of per-sample means by its global batch, whose
  zero-advantage samples count too. A row's weight before is its copies in
  the batch (1 unless `optim.global_batch_size` duplicated it)."""
  scale = 1.0 / max(int(samples), 1)
  return {
      name: {**sub, "weights": np.asarray(sub["weights"], np.float32) * scale}
      for name, sub in batch.items()
  }


def _microbatched(
    loss_of, sub, rows_per_microbatch: int, remat: bool = True, summed=False
):
  """`loss_of(sub)` over micro-batches, one at a time, with an exact mean.

  The sub-batch's rows are split into micro-batches of `rows_per_microbatch`
  (row i goes to micro-batch i % n, which keeps the row sharding on the
  micro-batch's own row axis); a `lax.scan` with a rematerialised body runs
  them, so only one micro-batch's activations are alive, and the gradient of
  the combined loss is the accumulated gradient. Token-level means are
  recombined weighted by each micro-batch's token weight, which gives
  exactly the whole batch's mean; `num_tokens` is summed.

  Args:
    loss_of: sub-batch -> (mean loss, metrics of means).
    sub: the role's sub-batch.
    rows_per_microbatch: 0 (or >= rows): no split.
    remat: recompute each micro-batch's forward in the backward pass (keep
      only its inputs); False keeps its residuals across the scan, which
      saves a forward pass when the model rematerialises its own layers.
    summed: the loss is a sum over rows (`losses.sample_sum`): the
      micro-batches' losses add up instead.

  Returns:
    (loss, metrics) as `loss_of` would give on the whole sub-batch.
  """
  rows = sub["tokens"].shape[0]
  if rows_per_microbatch <= 0 or rows_per_microbatch >= rows:
    return loss_of(sub)
  if rows % rows_per_microbatch:
    raise ValueError(
        f"config.optim.microbatch_rows={rows_per_microbatch} must divide the"
        f" sub-batch's {rows} rows"
    )
  n = rows // rows_per_microbatch
  split = jax.tree.map(
      lambda x: x.reshape((rows_per_microbatch, n) + x.shape[1:]).swapaxes(
          0, 1
      ),
      dict(sub),
  )

  def body(carry, mb):
    loss, metrics = loss_of(mb)
    weight = jnp.sum(losses.token_weights(mb["loss_mask"], mb["weights"]))
    return carry, (loss, metrics, weight)

  if remat:
    body = jax.checkpoint(body)

  _, (loss, metrics, weight) = jax.lax.scan(body, None, split)
  total = jnp.sum(weight)
  total = jnp.where(total > 0, total, 1.0)
  combined = {
      k: jnp.sum(v) if k == "num_tokens" else jnp.sum(v * weight) / total
      for k, v in metrics.items()
  }
  if summed:
    return jnp.sum(loss), combined
  return jnp.sum(loss * weight) / total, combined


def _check_batch(batch: Batch, keys: tuple[str, ...], multiple: int) -> None:
  """Clear errors for a batch the jitted step cannot take."""
  if not isinstance(batch, Mapping) or not set(batch) <= {"designer", "agent"}:
    raise ValueError(
        "batch must be a dict with sub-batches 'designer' and/or 'agent', got"
        f" keys {list(batch) if isinstance(batch, Mapping) else type(batch)}"
    )
  for role, sub in batch.items():
    missing = [k for k in keys if k not in sub]
    if missing:
      raise ValueError(
          f"batch[{role!r}] lacks {missing}; build it with"
          " spade.selfplay.batching.make_batch"
      )
    rows, length = sub["tokens"].shape
    if rows % multiple:
      raise ValueError(
          f"batch[{role!r}] has {rows} rows, not a multiple of the mesh's"
          f" batch axes size {multiple}; pad with zero-weight rows"
          " (make_batch(row_multiple=...))"
      )
    for k in keys:
      want = (rows,) if k in ("advantages", "weights") else (rows, length)
      if tuple(sub[k].shape) != want:
        raise ValueError(
            f"batch[{role!r}][{k!r}] has shape {tuple(sub[k].shape)}, expected"
            f" {want}"
        )


def _apply_gradient(
    loss_fn, optimizer, scale, params, adapters, opt_state, ref, batch
):
  """One optimizer step on `params`, or on `adapters` when they are given.

  With adapters (`spade.train.lora`) the gradient is the factors' and
  `params` move by the factors' change, so they stay the weights the model
  runs with. Returns (params, adapters, opt_state, metrics).
  """
  if adapters is None:
    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        params, ref, batch
    )
    updates, opt_state = optimizer.update(grads, opt_state, params)
    new_params, new_adapters = optax.apply_updates(params, updates), None
  else:

    def of_adapters(adapters):
      return loss_fn(lora.attach(params, adapters, scale), ref, batch)

    (loss, metrics), grads = jax.value_and_grad(of_adapters, has_aux=True)(
        adapters
    )
    updates, opt_state = optimizer.update(grads, opt_state, adapters)
    new_adapters = optax.apply_updates(adapters, updates)
    new_params = lora.shift(params, adapters, new_adapters, scale)
  metrics = dict(metrics)
  metrics["train/loss"] = loss
  metrics["train/grad_norm"] = optax.tree.norm(grads)
  metrics["train/update_norm"] = optax.tree.norm(updates)
  return new_params, new_adapters, opt_state, metrics


def _step_with(
    loss_fn, optimizer, scale, state: state_lib.TrainState, batch: Batch
) -> tuple[state_lib.TrainState, Metrics]:
  """Shared tail: gradient, optimizer update, new rng, global metrics."""
  rng, _ = jax.random.split(state.rng)
  params, adapters, opt_state, metrics = _apply_gradient(
      loss_fn,
      optimizer,
      scale,
      state.params,
      state.adapters,
      state.opt_state,
      state.ref_params,
      batch,
  )
  new_state = state.replace(
      params=params,
      adapters=adapters,
      opt_state=opt_state,
      step=state.step + 1,
      rng=rng,
  )
  return new_state, metrics


def _minibatch_rows(
    batch: Batch, key: jax.Array, epochs: int, num_minibatches: int
) -> dict[str, jax.Array]:
  """Row indices of every optimizer step, per role: int32[E * M, rows / M].

  Each epoch visits every row once, in a fresh random order (one permutation
  per epoch and role), split into `num_minibatches` equal parts. One
  minibatch needs no order: every epoch is then the whole batch in place.
  """
  rows_of = {}
  for i, (name, sub) in enumerate(sorted(batch.items())):
    rows = sub["tokens"].shape[0]
    if num_minibatches == 1:
      order = jnp.broadcast_to(jnp.arange(rows), (epochs, rows))
    else:
      keys = jax.random.split(jax.random.fold_in(key, i), epochs)
      order = jax.vmap(lambda k, n=rows: jax.random.permutation(k, n))(keys)
    rows_of[name] = order.reshape(
        epochs * num_minibatches, rows // num_minibatches
    ).astype(jnp.int32)
  return rows_of


def _steps_with(
    loss_fn,
    optimizer,
    scale,
    epochs: int,
    num_minibatches: int,
    state: state_lib.TrainState,
    batch: Batch,
) -> tuple[state_lib.TrainState, Metrics]:
  """`epochs` x `num_minibatches` optimizer steps on one sampled batch.

  A `lax.scan` over the steps, each on its minibatch of rows (gathered from
  the batch by `_minibatch_rows`); `old_logprobs` stay the sampler's, so
  after the first step the ratio moves away from 1 and the clip binds.
  Metrics are means over the steps, except `num_tokens`, the tokens of one
  pass over the batch; `train/optimizer_steps` counts the steps.
  """
  rng, key = jax.random.split(state.rng)
  rows_of = _minibatch_rows(batch, key, epochs, num_minibatches)

  def body(carry, rows):
    params, adapters, opt_state = carry
    mb = {
        name: jax.tree.map(lambda x, r=rows[name]: x[r], dict(sub))
        for name, sub in batch.items()
    }
    params, adapters, opt_state, metrics = _apply_gradient(
        loss_fn,
        optimizer,
        scale,
        params,
        adapters,
        opt_state,
        state.ref_params,
        mb,
    )
    return (params, adapters, opt_state), metrics

  (params, adapters, opt_state), per_step = jax.lax.scan(
      body, (state.params, state.adapters, state.opt_state), rows_of
  )
  metrics = {
      k: jnp.sum(v) / epochs if k.endswith("num_tokens") else jnp.mean(v)
      for k, v in per_step.items()
  }
  metrics["train/optimizer_steps"] = jnp.float32(epochs * num_minibatches)
  new_state = state.replace(
      params=params,
      adapters=adapters,
      opt_state=opt_state,
      step=state.step + epochs * num_minibatches,
      rng=rng,
  )
  return new_state, metrics


def _compile(
    step,
    mesh,
    config,
    check_keys,
    needs_reference: bool = False,
    num_minibatches: int = 1,
) -> UpdateFn:
  """jit with state/batch shardings and donation, behind a checking wrapper.

  The state's shardings come from the first state passed in (its parameter
  tree decides them, through `state.state_shardings`), so the same function
  serves scratch and checkpoint parameters; a state with a different tree
  (e.g. with or without reference params) compiles once more.
  """
  rules = _rules(config)
  axes = batch_axes(config)
  # One prefix sharding for every batch leaf: all lead with the row axis.
  batch_sh = jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec(axes if axes else None)
  )
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  multiple = math.prod(mesh.shape[a] for a in axes)
  compiled = {}

  def update_fn(state, batch):
    _check_batch(batch, check_keys, multiple)
    for role, sub in batch.items():
      if sub["tokens"].shape[0] % num_minibatches:
        raise ValueError(
            f"batch[{role!r}] has {sub['tokens'].shape[0]} rows, not a"
            f" multiple of config.optim.num_minibatches={num_minibatches};"
            " pad with zero-weight rows (make_batch(row_multiple=...))"
        )
    if needs_reference and state.ref_params is None:
      raise ValueError(
          "config.optim.kl_coef > 0 (or designer_kl_coef > 0) needs reference"
          " params in the state:"
          " create it with state.create_state(..., keep_reference=True)"
      )
    # Traced under the mesh and rules, so the model's logical activation
    # constraints (batch over data x fsdp, ...) shape the partitioning.
    with sharding.use_rules(mesh, rules):
      return jitted(state)(state, batch)

  def jitted(state):
    key = jax.tree.structure(state)
    if key not in compiled:
      state_sh = state_lib.state_shardings(state, mesh, rules)
      compiled[key] = jax.jit(
          step,
          in_shardings=(state_sh, batch_sh),
          out_shardings=(state_sh, replicated),
          donate_argnums=(0,),
      )
    return compiled[key]

  def lower(state, batch):
    """The step lowered for `state` and `batch` (arrays or abstract
    `jax.ShapeDtypeStruct`s): `.compile()` it to read its memory and cost
    without running it (`spade.compile`)."""
    _check_batch(batch, check_keys, multiple)
    with sharding.use_rules(mesh, rules):
      return jitted(state).lower(state, batch)

  update_fn.batch_sharding = batch_sh
  update_fn.compiled = compiled
  update_fn.lower = lower
  return update_fn


def make_update_step(
    model: nn.Module,
    optimizer: optax.GradientTransformation,
    mesh: jax.sharding.Mesh,
    config: ml_collections.ConfigDict,
) -> UpdateFn:
  """The self-play update: designer + agent policy losses, one step.

  Args:
    model: `transformer.build_model(config.model)`.
    optimizer: `state.make_optimizer(config.optim)` (the same object the
      state was made with).
    mesh: the device mesh (axes named as in `config.mesh.rules`).
    config: the full config; reads `config.optim` (clip_low, clip_high,
      kl_coef, designer_kl_coef, designer_loss_weight, agent_loss_weight,
      designer_tis, agent_tis, max_importance_weight, epochs,
      num_minibatches) and
      `config.mesh.rules`.

  Returns:
    update_fn(state, batch) -> (new state, metrics). `batch` holds
    "designer" and "agent" sub-batches (module docstring); the state is
    donated. One call takes `epochs` x `num_minibatches` optimizer steps:
    each epoch shuffles the rows of each role and splits them into
    `num_minibatches` minibatches (rows must divide evenly), all scored
    against the sampler's `old_logprobs`, so the clip bounds how far the
    policy moves. Metrics are replicated scalars, means over the steps:
    train/loss, train/grad_norm, train/update_norm and per role
    train/{role}_{loss, pg_loss, kl, clip_frac, approx_kl, ratio_mean,
    num_tokens} (plus is_weight_mean and is_truncated_frac for a role with
    truncated importance weights); num_tokens is one pass's; train/optimizer_steps the count.
  """
  o = config.optim
  use_kl = state_lib.keeps_reference(config)
  # Truncated importance weights (the reference's --use-tis, clip
  # `max_importance_weight`, slime's 2.0), which slime applies to every
  # sample: designer rows, trained after their window closes
  # (`designer_delay`) on samples of an older policy, unless `designer_tis`
  # is off, and agent rows unless `agent_tis` is off (ours: PPO clipping
  # against the sampler's log-probs; the reference only warns when a delay
  # runs without --use-tis).
  importance = {
      "designer": o.max_importance_weight if o.designer_tis else None,
      "agent": o.max_importance_weight if o.get("agent_tis") else None,
  }
  role_weight = {
      "designer": o.designer_loss_weight,
      "agent": o.agent_loss_weight,
  }
  role_kl = state_lib.kl_coefs(config)
  # "sample_mean" (slime's): each row's token mean, summed over both roles'
  # rows; the host gives each row the weight 1 / the rows there were
  # (`sample_weights`). "token_mean" (ours): each role's token mean.
  reduction = (
      "sample_sum" if o.get("loss_reduction") == "sample_mean" else "token_mean"
  )

  def loss_fn(params, ref_params, batch):
    total = jnp.zeros((), jnp.float32)
    metrics = {}
    for role in transformer.Role:
      name = role.key
      if name not in batch:
        continue

      def role_loss(sub, name=name, role=role):
        logp = _logprobs(model, params, sub, role, o.logprob_chunk)
        ref_logp = None
        if role_kl[name] > 0:
          ref_logp = jax.lax.stop_gradient(
              _logprobs(model, ref_params, sub, role, o.logprob_chunk)
          )
        return losses.policy_loss(
            logp,
            sub["old_logprobs"],
            sub["advantages"],
            sub["loss_mask"],
            sub["weights"],
            clip_low=o.clip_low,
            clip_high=o.clip_high,
            ref_logprobs=ref_logp,
            kl_coef=role_kl[name],
            max_importance_weight=importance[name],
            reduction=reduction,
            kl_estimator=o.get("kl_estimator", "low_var_kl"),
        )

      loss, m = _microbatched(
          role_loss, batch[name], o.microbatch_rows,
          o.microbatch_remat, summed=reduction == "sample_sum",
      )  # fmt: skip
      total = total + role_weight[name] * loss
      metrics[f"train/{name}_loss"] = loss
      metrics.update({f"train/{name}_{k}": v for k, v in m.items()})
    return total, metrics

  epochs, num_minibatches = o.epochs, o.num_minibatches
  if epochs < 1 or num_minibatches < 1:
    raise ValueError(
        f"config.optim.epochs={epochs} and num_minibatches={num_minibatches}"
        " must be >= 1"
    )
  scale = lora_scale(o)
  if epochs * num_minibatches == 1:
    # One accumulation step: no scan, no gather, bit-identical to a plain step.
    step = functools.partial(_step_with, loss_fn, optimizer, scale)
  else:
    step = functools.partial(
        _steps_with, loss_fn, optimizer, scale, epochs, num_minibatches
    )

  def counted(state, batch):
    new_state, metrics = step(state, batch)
    metrics.setdefault(
        "train/optimizer_steps", jnp.float32(epochs * num_minibatches)
    )
    return new_state, metrics

  return _compile(
      counted,
      mesh,
      config,
      _POLICY_KEYS,
      needs_reference=use_kl,
      num_minibatches=num_minibatches,
  )


def make_sft_step(
    model: nn.Module,
    optimizer: optax.GradientTransformation,
    mesh: jax.sharding.Mesh,
    config: ml_collections.ConfigDict,
) -> UpdateFn:
  """The warm-start step: cross-entropy on the masked tokens of each role.

  Same arguments, sharding and donation as `make_update_step`; each
  sub-batch needs tokens, input_mask, loss_mask and weights. Roles are
  weighted by config.optim.{designer,agent}_loss_weight. Metrics:
  train/loss, train/grad_norm, train/update_norm, train/{role}_{nll,
  target_prob, num_tokens}.
  """
  o = config.optim
  role_weight = {
      "designer": o.designer_loss_weight,
      "agent": o.agent_loss_weight,
  }

  def loss_fn(params, ref_params, batch):
    del ref_params
    total = jnp.zeros((), jnp.float32)
    metrics = {}
    for role in transformer.Role:
      name = role.key
      if name not in batch:
        continue

      def role_loss(sub, role=role):
        logp = _logprobs(model, params, sub, role, o.logprob_chunk)
        return losses.sft_loss(logp, sub["loss_mask"], sub["weights"])

      loss, m = _microbatched(
          role_loss, batch[name], o.microbatch_rows,
          o.microbatch_remat,
      )  # fmt: skip
      total = total + role_weight[name] * loss
      metrics.update({f"train/{name}_{k}": v for k, v in m.items()})
    return total, metrics

  step = functools.partial(_step_with, loss_fn, optimizer, lora_scale(o))
  return _compile(step, mesh, config, _SFT_KEYS)
