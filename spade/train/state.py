"""The train state pytree, the optimizer, and where the state lives on a mesh.

`TrainState` holds everything the update step changes: the shared parameters
(trunk and output layers), the optimizer state, the step counter and the rng,
plus the frozen reference parameters when a KL term needs them
(`config.optim.kl_coef > 0`; otherwise `ref_params` is None and costs
nothing) and the low-rank adapters when the update trains those instead of
the parameters (`config.optim.lora_rank > 0`, `spade.train.lora`; the
optimizer state is then over the adapters). The host loop adds its
curriculum state (memory, replay, corpus cursor) beside it in the
checkpoint.

Sharding: the parameters follow their logical axes through the rule table
`config.mesh.rules`; every optimizer-state subtree shaped like the parameters
(Adam's moments) follows the parameters; scalars and the rng are replicated.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import flax
import jax
import jax.numpy as jnp
import ml_collections
import optax

from spade.model import sharding
from spade.train import lora

PyTree = Any


@flax.struct.dataclass
class TrainState:
  """Parameters, optimizer state, step, rng and optional reference params.

  Attributes:
    params: the shared parameter tree (see spade/model/transformer.py).
    opt_state: the optax state of `make_optimizer`.
    step: int32 scalar, updates applied so far.
    rng: uint32[2] PRNG key (raw, so checkpoints need no key-type support).
    ref_params: frozen copy of the initial params for the KL term, or None.
    adapters: the LoRA factors the optimizer trains (`spade.train.lora`),
      or None when it trains `params` themselves. `params` are then the
      weights the model runs with, the adapters' product included.
  """

  params: PyTree
  opt_state: PyTree
  step: jax.Array
  rng: jax.Array
  ref_params: PyTree | None = None
  adapters: PyTree | None = None

  @property
  def trainable(self) -> PyTree:
    """What the optimizer updates: the adapters, else the parameters."""
    return self.params if self.adapters is None else self.adapters


def make_optimizer(
    optim_config: ml_collections.ConfigDict,
) -> optax.GradientTransformation:
  """AdamW after global-norm clipping, from `config.optim`.

  Keys read: learning_rate, b1, b2, eps, weight_decay, weight_decay_mask,
  grad_clip (<= 0: no clipping). `weight_decay_mask="megatron"` (the
  reference's trainer) decays only matrices: no bias, no norm scale, no
  one-dimensional parameter (`decays`); "all" decays every parameter.
  """
  c = optim_config
  if c.learning_rate <= 0:
    raise ValueError(
        f"config.optim.learning_rate={c.learning_rate} must be > 0"
    )
  adam = optax.adamw(
      learning_rate=c.learning_rate,
      b1=c.b1,
      b2=c.b2,
      eps=c.eps,
      weight_decay=c.weight_decay,
      mask=_decay_mask(c.get("weight_decay_mask", "megatron")),
  )
  if c.grad_clip > 0:
    return optax.chain(optax.clip_by_global_norm(c.grad_clip), adam)
  return adam


WEIGHT_DECAY_MASKS = ("megatron", "all")


def decays(path: tuple, leaf: Any) -> bool:
  """Megatron-LM's rule (`get_param_groups`, which slime's trainer uses): a
  parameter named `.bias` or of one dimension takes no weight decay. Here a
  norm's multiplier is `scale` and biases may be (heads, head_dim), and a
  scanned stack adds a dimension, so the rule goes by name as well."""
  name = None
  if path:
    name = getattr(path[-1], "key", getattr(path[-1], "name", None))
  return not (name in ("bias", "scale") or jnp.ndim(leaf) <= 1)


def _decay_mask(kind: str):
  if kind == "all":
    return None
  if kind != "megatron":
    raise ValueError(
        f"config.optim.weight_decay_mask={kind!r}: use one of "
        f"{WEIGHT_DECAY_MASKS}"
    )
  return lambda params: jax.tree_util.tree_map_with_path(decays, params)


def kl_coefs(config: ml_collections.ConfigDict) -> dict[str, float]:
  """Each role's KL weight: `optim.kl_coef`, plus `designer_kl_coef` (ours)
  on the designer's rows."""
  o = config.optim
  return {
      "designer": o.kl_coef + o.get("designer_kl_coef", 0.0),
      "agent": o.kl_coef,
  }


def keeps_reference(config: ml_collections.ConfigDict) -> bool:
  """Whether the state carries frozen reference params (a KL term on)."""
  return max(kl_coefs(config).values()) > 0


def create_train_state(
    params: PyTree,
    optimizer: optax.GradientTransformation,
    rng: jax.Array,
    *,
    keep_reference: bool = False,
    lora_rank: int = 0,
) -> TrainState:
  """A fresh state at step 0, unplaced (`create_state` puts it on a mesh).

  Args:
    params: the initial parameters.
    optimizer: from `make_optimizer`.
    rng: a PRNG key (raw uint32[2] or typed; stored raw).
    keep_reference: keep a copy of `params` as the KL reference.
    lora_rank: > 0 trains rank-`lora_rank` adapters instead of `params`
      (`config.optim.lora_rank`).
  """
  if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
    rng = jax.random.key_data(rng)
  rng = jnp.asarray(rng, jnp.uint32)
  adapters = None
  if lora_rank > 0:
    adapters = lora.init_adapters(
        params, lora_rank, jax.random.fold_in(jax.random.wrap_key_data(rng), 7)
    )
  return TrainState(
      params=params,
      opt_state=optimizer.init(params if adapters is None else adapters),
      step=jnp.zeros((), jnp.int32),
      rng=rng,
      ref_params=(jax.tree.map(jnp.array, params) if keep_reference else None),
      adapters=adapters,
  )


def state_shardings(
    state: TrainState, mesh: jax.sharding.Mesh, rules: Sequence[tuple]
) -> TrainState:
  """Shardings for every leaf of `state` (arrays or ShapeDtypeStructs).

  Parameters (and the reference copy) follow their logical axes through
  `rules` (`config.mesh.rules`), replicating a dimension its mesh axes do not
  divide (`spade.model.sharding.fitted_param_shardings`); optimizer-state
  subtrees shaped like the parameters follow the parameters; everything
  else is replicated.

  Args:
    state: a TrainState, concrete or abstract (`jax.eval_shape`).
    mesh: the mesh.
    rules: the logical-axis rule table.

  Returns:
    A TrainState of NamedShardings.
  """
  params_sh = sharding.fitted_param_shardings(state.params, mesh, rules)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  adapters_sh = None
  if state.adapters is not None:
    adapters_sh = sharding.fitted_logical_shardings(
        state.adapters, lora.adapter_logical_axes(state.params), mesh, rules
    )
  trained_sh = params_sh if adapters_sh is None else adapters_sh
  trained_def = jax.tree.structure(state.trainable)

  def like_trained(x) -> bool:
    return jax.tree.structure(x) == trained_def

  opt = jax.tree.map(
      lambda x: trained_sh if like_trained(x) else replicated,
      state.opt_state,
      is_leaf=like_trained,
  )
  return TrainState(
      params=params_sh,
      opt_state=opt,
      step=replicated,
      rng=replicated,
      ref_params=None if state.ref_params is None else params_sh,
      adapters=adapters_sh,
  )


def create_state(
    params: PyTree,
    optimizer: optax.GradientTransformation,
    *,
    rng: jax.Array,
    mesh: jax.sharding.Mesh,
    rules: Sequence[tuple],
    keep_reference: bool = False,
    lora_rank: int = 0,
) -> TrainState:
  """A step-0 TrainState placed on `mesh` as the update step expects it.

  No device ever holds a whole copy of a sharded tensor: each parameter is
  placed by itself with its own NamedSharding (a host array goes shard by
  shard to the devices that own each shard; parameters already placed so,
  e.g. by `spade.model.sharding.init_sharded_params`, are copied shard by
  shard on their own devices, so the state owns its buffers), and the
  optimizer state is created by a jit whose outputs are sharded like
  the parameters.

  Args:
    params: initial parameters (host or device arrays), e.g. from
      `spade.model.loading.initial_params` or
      `spade.model.sharding.init_sharded_params`.
    optimizer: from `make_optimizer(config.optim)`.
    rng: PRNG key for the state.
    mesh: the device mesh.
    rules: `config.mesh.rules`.
    keep_reference: keep a frozen copy of `params` for the KL term
      (`keeps_reference(config)`).
    lora_rank: `config.optim.lora_rank` (> 0: train adapters, see
      `create_train_state`).
  """
  make = functools.partial(
      create_train_state,
      optimizer=optimizer,
      keep_reference=keep_reference,
      lora_rank=lora_rank,
  )
  abstract = jax.eval_shape(make, params, rng=rng)
  shardings = state_shardings(abstract, mesh, rules)
  # A copy even where the placement already matches: the update step
  # donates the state, which must not free the caller's arrays.
  place = functools.partial(jax.device_put, may_alias=False)
  params = jax.tree.map(place, params, shardings.params)

  def rest(params, rng):
    # Everything but the parameters, which are not copied again.
    return make(params, rng=rng).replace(params=None)

  with sharding.use_rules(mesh, rules):
    state = jax.jit(rest, out_shardings=shardings.replace(params=None))(
        params, rng
    )
  return state.replace(params=params)
