"""The shared decoder: Gemma 3 and Qwen2/Qwen3, one model for both roles.

One Flax Linen module covers the families; `config.model` switches the parts
that differ (`spade.model.layers`). There is no forked copy per family.

Parameter sharing between the roles. Both roles run the same trunk, so these
parameters are SHARED by the designer and the agent:

  embedder/input_embedding, every layer (norms, attention projections, q/k
  norms, MLP), final_norm/scale.

The output layer is shared too by default (`config.model.separate_heads`
False), as in the reference, which trains one model for both roles:

  heads/shared/unembedding     used by both roles

With `separate_heads` True (ours) each role has its own output layer:

  heads/designer/unembedding   used when `role == Role.DESIGNER`
  heads/agent/unembedding      used when `role == Role.AGENT`

`head_names` and `head_name` are the one place that maps a config and a role
to these names. `config.model.tie_embeddings` says whether the *checkpoint*
ties its output layer to the input embedding (the loaders read it); in this
module every head is a parameter of its own, apart from the input embedding,
initialised from the checkpoint's output layer when a checkpoint is loaded,
and randomly in a scratch init.

Layers run under `nn.scan`, so the program (and its compile time) does not
grow with depth. Gemma 3 repeats a period of `global_every` layers (sliding,
..., sliding, global), and a period is the scanned unit: layer g * P + j is
`layers/block_j` at index g of the leading axis, P = `global_every` when
`sliding_window` > 0 and 1 otherwise (every layer global, as in Qwen2). The
num_layers % P layers after the last full period (all sliding) are the second
stack, `tail/block_j`, scanned once. Every layer parameter thus has a leading
"layers" axis:

  layers/block_j/{attn/{q,k,v,o}_proj, attn/{q,k}_norm, mlp/{gate,up,down},
                  pre_attention_norm, ...}        [num_layers // P, ...]
  tail/block_j/...                                [1, ...]

`spade.model.layout` converts between this layout and one subtree per layer.
In the training forward each layer is rematerialised with the policy
`config.model.remat` names (`architecture.REMAT_POLICIES`). Decoding uses
the KV cache of `spade.model.kv_cache`.
"""

from __future__ import annotations

import enum
from typing import Any, Callable, Mapping, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from spade.model import architecture
from spade.model import kv_cache
from spade.model import layers
from spade.model import layout

Array = jax.Array
Params = Mapping[str, Any]


class Role(enum.IntEnum):
  """Which role the model plays; `head_name` says which head it reads."""

  DESIGNER = 0
  AGENT = 1

  @property
  def key(self) -> str:
    """The role's name, "designer" or "agent": batches, losses and metrics
    are keyed by it, and so is its own head under `separate_heads`."""
    return self.name.lower()

  @classmethod
  def of(cls, key: str) -> Role:
    """The role named `key` ("designer" or "agent")."""
    for role in cls:
      if role.key == key:
        return role
    raise ValueError(
        f"unknown role {key!r}; the roles are {[r.key for r in cls]}"
    )


# The one output layer of both roles when `config.model.separate_heads` is
# False.
SHARED_HEAD = "shared"


def head_names(model_config) -> tuple[str, ...]:
  """The output layers `config.model` builds, `heads/<name>/unembedding`
  each: ("shared",), or ("designer", "agent") with `separate_heads`."""
  cfg = architecture.ModelConfig.from_config(model_config)
  if cfg.separate_heads:
    return tuple(r.key for r in Role)
  return (SHARED_HEAD,)


def head_name(model_config, role: Role) -> str:
  """The output layer `role` reads: the shared one, or its own with
  `config.model.separate_heads`."""
  cfg = architecture.ModelConfig.from_config(model_config)
  return Role(role).key if cfg.separate_heads else SHARED_HEAD


def heads_mismatch(found, want) -> str | None:
  """Why parameters with the output layers `found` do not fit a model that
  builds `want` (`head_names`), or None when they fit.

  The message names the `model.separate_heads` value that builds `found`,
  so parameters written under the other value say what to set.
  """
  found, want = sorted(found), sorted(want)
  if found == want:
    return None
  fix = "no value of model.separate_heads builds them"
  for separate in (False, True):
    if found == sorted(head_names(dict(separate_heads=separate))):
      fix = f"set model.separate_heads={separate} to use them"
  listed = lambda names: ", ".join(f"heads/{n}" for n in names) or "none"
  return (
      f"the parameters have the output layers {listed(found)}, but this"
      f" config.model builds {listed(want)}; {fix}"
  )


class _Group(nn.Module):
  """One scanned step: `len(kinds)` consecutive layers (block_0, block_1, ...).

  Attributes:
    cfg: the model config.
    kinds: per block, whether it is a global layer (static).
    remat: rematerialise each block with the policy `cfg.remat` names
      (`architecture.REMAT_POLICIES`).
  """

  cfg: architecture.ModelConfig
  kinds: tuple[bool, ...]
  remat: bool

  @nn.compact
  def __call__(self, carry, index, positions, key_pos, cache_index):
    x, cache = carry
    block = layers.Block
    if self.remat:
      # Inside a scan XLA cannot merge the recomputation with the forward
      # anyway, so CSE prevention would only cost.
      block = nn.remat(
          layers.Block,
          policy=architecture.REMAT_POLICIES[self.cfg.remat],
          prevent_cse=False,
      )
    named = [(f"block_{j}", g) for j, g in enumerate(self.kinds)]
    x, new_cache = _run_blocks(
        block, self.cfg, named, x, positions, key_pos, cache, cache_index,
        index,
    )  # fmt: skip
    return (x, new_cache), None


def _run_blocks(
    block, cfg, named, x, positions, key_pos, cache, cache_index, index
):
  """Runs `block` layers in order, (name, is_global) each, under the calling
  module; layer `name` reads and writes `cache[name]`. Returns (x, cache)."""
  new_cache = None if cache is None else dict(cache)
  for name, is_global in named:
    x, layer_cache = block(cfg, is_global, name=name)(
        x,
        positions,
        key_pos,
        None if cache is None else cache[name],
        cache_index,
        index,
    )
    if cache is not None:
      new_cache[name] = layer_cache
  return x, new_cache


def _stack(
    cfg: architecture.ModelConfig,
    name: str,
    first: int,
    length: int,
    size: int,
    remat,
) -> nn.Module:
  """One `nn.scan` over `length` groups of `size` layers, params stacked."""
  kinds = tuple(cfg.is_global(first + j) for j in range(size))
  scanned = nn.scan(
      _Group,
      variable_axes={"params": 0, layers.LORA: 0},
      split_rngs={"params": True},
      in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast),
      length=length,
      metadata_params={nn.PARTITION_NAME: "layers"},
  )
  return scanned(cfg, kinds, remat, name=name)


class Transformer(nn.Module):
  """The shared decoder with its output layers (`head_names`).

  Attributes:
    cfg: `config.model` as a ConfigDict, a mapping or an
      `architecture.ModelConfig`.
    per_layer: run the layers as a Python loop over one `layer_i` subtree
      each (`layout.to_per_layer_layout`), with a per-layer cache
      (`kv_cache.init_cache(..., per_layer=True)`): the decoding layout
      (`sampling_fns`). A scanned stack slices each layer's weights and
      cache out of the stacked arrays at every step, and XLA on CPU copies
      those slices: batch-8 decoding of Gemma 3 270M took 412 ms per step
      scanned against 101 ms per layer.
  """

  cfg: Any
  per_layer: bool = False

  def __post_init__(self):
    if not isinstance(self.cfg, architecture.ModelConfig):
      object.__setattr__(
          self, "cfg", architecture.ModelConfig.from_config(self.cfg)
      )
    super().__post_init__()

  @nn.compact
  def __call__(
      self,
      tokens: Array,
      positions: Array,
      role: Role,
      *,
      input_mask: Array | None = None,
      cache: kv_cache.Cache | None = None,
      cache_index: Array | None = None,
      last_only: bool = False,
      targets: Array | None = None,
      chunk: int = 256,
      score_mask: Array | None = None,
  ) -> tuple[Array, kv_cache.Cache | None]:
    """Runs the decoder.

    Args:
      tokens: int32[B, L].
      positions: int32[B, L], the RoPE position of each token; attention is
        causal by position (a key is visible when its position is <= the
        query's), so positions must increase along each row's real tokens.
      role: which role's head (`head_name`) gives the logits (static).
      input_mask: bool[B, L], False for padding; padding is never attended to.
        Default: all True.
      cache: from `kv_cache.init_cache`, or None for a plain full forward.
      cache_index: int32 scalar, the cache time of `tokens[:, 0]` (the number
        of steps already written); required with `cache`.
      last_only: return logits for the last position only ([B, 1, V]); the
        sampler's prefill needs no more and the vocab matmul dominates.
      targets: int32[B, L]; when given, return instead the float32 [B, L]
        log-probability of `targets[:, t]` under position t's logits,
        computed `chunk` positions at a time with rematerialisation, so the
        [B, L, V] logits never exist at once (the update's memory for a
        150k-262k vocabulary).
      chunk: positions per chunk with `targets`.
      score_mask: optional bool[B, L] with `targets`: the positions whose
        log-probability is needed; a chunk with none in any row is not
        computed (its log-probabilities are 0), so a long prompt costs no
        vocabulary matmuls.

    Returns:
      (float32 logits [B, L, V] (or [B, 1, V]) or target logprobs [B, L],
      the updated cache or None).
    """
    cfg = self.cfg
    if cache is not None and cache_index is None:
      raise ValueError("Transformer: pass cache_index together with cache")
    if input_mask is None:
      input_mask = jnp.ones(tokens.shape, bool)
    key_pos = jnp.where(input_mask, positions, -1).astype(jnp.int32)
    dtype = jnp.dtype(cfg.dtype)
    pdt = jnp.dtype(cfg.param_dtype)

    embedding = _Embedder(cfg, name="embedder")()
    if layers.stationary(cfg, tokens):
      # A one-token step gathers its rows from the table's own shards.
      tokens = layers.constrain(tokens, "decode_batch", None)
      x = jnp.take(embedding, tokens, axis=0).astype(dtype)
      x = layers.constrain(x, "decode_batch", None, "embed")
    else:
      x = jnp.take(embedding, tokens, axis=0).astype(dtype)
    if cfg.scale_embeddings:
      x = x * jnp.sqrt(float(cfg.embed_dim)).astype(dtype)
    x = layers.residual(cfg, x)

    new_cache = {} if cache is not None else None
    # Training (no cache) can keep only what the remat policy saves of each
    # layer and recompute the rest in the backward pass: attention scores
    # and MLP activations of every layer at once do not fit a real model's
    # update in host memory.
    remat = cfg.remat != "none" and cache is None
    if self.per_layer:
      block = layers.Block
      if remat:
        block = nn.remat(
            layers.Block, policy=architecture.REMAT_POLICIES[cfg.remat]
        )
      named = [(f"layer_{i}", cfg.is_global(i)) for i in range(cfg.num_layers)]
      x, new_cache = _run_blocks(
          block, cfg, named, x, positions, key_pos, cache, cache_index, None
      )
    for name, first, length, size in [] if self.per_layer else cfg.stacks():
      (x, stack_cache), _ = _stack(cfg, name, first, length, size, remat)(
          (x, None if cache is None else cache[name]),
          jnp.arange(length, dtype=jnp.int32),
          positions,
          key_pos,
          cache_index,
      )
      if cache is not None:
        new_cache[name] = stack_cache
    if last_only:
      x = x[:, -1:]
    x = layers.RMSNorm(cfg.norm_eps, pdt, "final_norm", name="final_norm")(x)

    if targets is not None:
      table, factors = _Heads(cfg, name="heads")(x, Role(role), table_only=True)
      logp = chunked_logprobs(x, table, targets, chunk, score_mask, factors)
      return logp, new_cache
    logits = _Heads(cfg, name="heads")(x, Role(role))
    if layers.stationary(cfg, x):  # where the head gave them
      return logits, new_cache
    return layers.constrain(logits, "batch", "length", "vocab"), new_cache


def chunked_logprobs(
    x: Array,
    table: Array,
    targets: Array,
    chunk: int,
    score_mask: Array | None = None,
    factors: tuple[Array, Array] | None = None,
) -> Array:
  """log softmax(x @ table.T)[targets], `chunk` positions at a time.

  Each chunk's logits are recomputed in the backward pass
  (`jax.checkpoint`), so memory holds [B, chunk, V] logits, not [B, L, V].

  Args:
    x: [B, L, E] final hidden states.
    table: [V, E] the role's unembedding.
    targets: int32[B, L] token ids to score.
    chunk: positions per chunk.
    score_mask: optional bool[B, L], the positions needed: a chunk without
      one (in any row) skips its matmul, forward and backward (`lax.cond`),
      and gives 0.
    factors: optional adapter factors (A[V, r], B[r, E]) of the table (see
      `layers.LORA`): gradient only, the value is the table's.

  Returns:
    float32[B, L].
  """
  b, length, e = x.shape
  chunk = max(1, min(chunk, length))
  n = -(-length // chunk)
  pad = n * chunk - length
  xs = jnp.pad(x, ((0, 0), (0, pad), (0, 0))).reshape(b, n, chunk, e)
  ts = jnp.pad(targets, ((0, 0), (0, pad))).reshape(b, n, chunk)
  table = table.astype(x.dtype)
  if score_mask is None:
    needed = jnp.ones((n,), bool)
  else:
    needed = jnp.pad(score_mask.astype(bool), ((0, 0), (0, pad)))
    needed = jnp.any(needed.reshape(b, n, chunk), axis=(0, 2))

  def score(xc, tc):
    logits = _head_logits(xc, table, factors)
    picked = jnp.take_along_axis(logits, tc[..., None], axis=-1)[..., 0]
    return picked - jax.nn.logsumexp(logits, axis=-1)

  def skip(xc, tc):
    del xc
    return jnp.zeros(tc.shape, jnp.float32)

  @jax.checkpoint
  def one(args):
    xc, tc, need = args
    if score_mask is None:
      return score(xc, tc)
    return jax.lax.cond(need, score, skip, xc, tc)

  out = jax.lax.map(
      one, (xs.transpose(1, 0, 2, 3), ts.transpose(1, 0, 2), needed)
  )
  return out.transpose(1, 0, 2).reshape(b, n * chunk)[:, :length]


class _Embedder(nn.Module):
  """The [vocab, embed] input embedding table."""

  cfg: architecture.ModelConfig

  @nn.compact
  def __call__(self) -> Array:
    return self.param(
        "input_embedding",
        layers.logical_init(
            nn.initializers.variance_scaling(1.0, "fan_in", "normal", 1, 0),
            "embedder",
            "input_embedding",
        ),
        (self.cfg.vocab_size, self.cfg.embed_dim),
        jnp.dtype(self.cfg.param_dtype),
    )


def _head_logits(
    x: Array, table: Array, factors: tuple[Array, Array] | None
) -> Array:
  """float32 x[B, L, E] @ table[V, E].T, plus an adapter's gradient-only term."""
  logits = jnp.einsum(
      "ble,ve->blv", x, table.astype(x.dtype),
      preferred_element_type=jnp.float32,
  )  # fmt: skip
  if factors is not None:
    a, b = factors
    xb = jnp.einsum(
        "ble,re->blr", jax.lax.stop_gradient(x), b.astype(x.dtype),
        preferred_element_type=jnp.float32,
    )  # fmt: skip
    delta = jnp.einsum(
        "blr,vr->blv", xb.astype(x.dtype), a.astype(x.dtype),
        preferred_element_type=jnp.float32,
    )  # fmt: skip
    logits = logits + layers.gradient_only(delta)
  return logits


class _Heads(nn.Module):
  """Holds every output layer (`head_names`, so all exist after init) and
  applies the role's (`head_name`)."""

  cfg: architecture.ModelConfig

  @nn.compact
  def __call__(self, x: Array, role: Role, table_only: bool = False):
    """float32 logits [B, L, V]; with `table_only`, (the role's table, its
    adapter factors or None) instead."""
    if not self.is_initializing():
      # Parameters of the other `separate_heads` value would fail below with
      # flax's "could not find parameter"; say which key to set instead.
      problem = heads_mismatch(
          self.variables.get("params", {}), head_names(self.cfg)
      )
      if problem:
        raise ValueError(problem)
    heads = {
        name: _UnembeddingHead(self.cfg, name=name)()
        for name in head_names(self.cfg)
    }
    table = heads[head_name(self.cfg, role)]
    if table_only:
      return table
    if layers.stationary(self.cfg, x):
      # The table stays on its shards (`config.model.decode_sharding`): the
      # rows come whole to each, which takes the part of them it needs. The
      # decoding layout's table is split over the vocabulary
      # (`layers.DECODE_PARAM_AXES`), and its logits stay there
      # (`layers.decode_logits`); a table split on "embed" gives partial
      # sums, reduce-scattered to that split.
      x = layers.rows_to_weights(x, ())
      return layers.decode_logits(_head_logits(x, *table))
    return _head_logits(x, *table)


class _UnembeddingHead(nn.Module):
  """One [vocab, embed] output table (and its adapter factors)."""

  cfg: architecture.ModelConfig

  @nn.compact
  def __call__(self) -> tuple[Array, tuple[Array, Array] | None]:
    table = self.param(
        "unembedding",
        layers.logical_init(
            nn.initializers.variance_scaling(1.0, "fan_in", "normal", 1, 0),
            self.name,
            "unembedding",
        ),
        (self.cfg.vocab_size, self.cfg.embed_dim),
        jnp.dtype(self.cfg.param_dtype),
    )
    factors = None
    if self.has_variable(layers.LORA, "a"):
      factors = (
          self.get_variable(layers.LORA, "a"),
          self.get_variable(layers.LORA, "b"),
      )
    return table, factors


def build_model(model_config) -> Transformer:
  """The decoder for `config.model` (a ConfigDict, mapping or ModelConfig)."""
  return Transformer(architecture.ModelConfig.from_config(model_config))


def init_params(model_config, rng: Array) -> dict[str, Any]:
  """A scratch init: plain (unboxed) float params in the contract's tree.

  The heads (`head_names`) are drawn independently; the loaders in
  `spade.model.loading` replace everything with checkpoint weights.
  """
  model = build_model(model_config)
  tokens = jnp.zeros((1, 1), jnp.int32)
  variables = jax.jit(lambda r: model.init(r, tokens, tokens, Role.DESIGNER))(
      rng
  )
  return nn.unbox(variables["params"])


def param_logical_axes(params: Params, decoding: bool | None = None) -> Any:
  """A tree like `params` of logical `PartitionSpec`s (`layers.PARAM_AXES`).

  Works on plain trees (the loaders' output), so checkpoint weights shard the
  same way as a scratch init. Leaves of the scanned stacks
  (`architecture.STACKS`) lead with the "layers" axis. In the decoding
  layout (`decoding`; by default, whether the tree is in it) the tables
  and the MLP's kernels take `layers.DECODE_PARAM_AXES`.
  """
  if decoding is None:
    decoding = layout.is_per_layer(params)

  def axes(path, leaf):
    names = tuple(getattr(p, "key", str(p)) for p in path)
    key = names[-2:]
    if key not in layers.PARAM_AXES:
      raise ValueError(
          f"parameter {'/'.join(names)} has no logical axes; add "
          f"{key} to spade.model.layers.PARAM_AXES"
      )
    spec = layers.PARAM_AXES[key]
    if decoding:
      spec = layers.DECODE_PARAM_AXES.get(key, spec)
    if names[0] in architecture.STACKS:
      spec = ("layers",) + spec
    if len(spec) != np.ndim(leaf):
      raise ValueError(
          f"parameter {'/'.join(names)} has shape {np.shape(leaf)} but its "
          f"logical axes are {spec}"
      )
    return jax.sharding.PartitionSpec(*spec)

  return jax.tree_util.tree_map_with_path(axes, nn.unbox(params))


def fitted_shardings(params: Params, mesh, rules) -> Any:
  """NamedShardings of a plain tree by `param_logical_axes` and `rules`
  (`sharding.fitted_param_shardings` normalises them), each dimension its
  mesh axes do not divide left whole (`layers.fit_sharding`). In the
  decoding layout a leaf whose decoding split the mesh does not divide
  (`layers.decode_fits`: the byte vocabulary's 259 rows over fsdp x
  tensor) keeps the train state's split, not whole on every chip."""
  fitted = jax.tree.map(
      layers.fit_sharding,
      params,
      nn.logical_to_mesh_sharding(param_logical_axes(params), mesh, rules),
  )
  if not layout.is_per_layer(params):
    return fitted
  training = nn.logical_to_mesh_sharding(
      param_logical_axes(params, decoding=False), mesh, rules
  )

  def pick(path, leaf, fit, train):
    key = tuple(str(getattr(p, "key", p)) for p in path)[-2:]
    if key not in layers.DECODE_PARAM_AXES or layers.decode_fits(
        key, np.shape(leaf), mesh, rules
    ):
      return fit
    return layers.fit_sharding(leaf, train)

  return jax.tree_util.tree_map_with_path(pick, params, fitted, training)


# The leaves every use of which casts them to `config.model.dtype` first
# (`layers.Linear`, the embedding's gather, `_head_logits`): stored in that
# type in the decoding layout, they give the same values.
_CAST_FOR_DECODING = (
    "kernel",
    layers.TRANSPOSED,
    "input_embedding",
    "unembedding",
)


def decode_dtypes(params: Params, model_config) -> Params:
  """`params` with the matmul weights in `config.model.dtype` when it is
  narrower than `param_dtype` (bfloat16 activations over float32 weights,
  the TPU configs): what every decode call would otherwise convert again
  (XLA hoists the conversion out of the step loop), and the bytes a step
  reads, halved. Norm scales and biases keep their type
  (they are used in float32)."""
  cfg = architecture.ModelConfig.from_config(model_config)
  dtype = jnp.dtype(cfg.dtype)

  def cast(path, leaf):
    name = str(getattr(path[-1], "key", path[-1]))
    if name in _CAST_FOR_DECODING and leaf.dtype.itemsize > dtype.itemsize:
      return leaf.astype(dtype)
    return leaf

  return jax.tree_util.tree_map_with_path(cast, params)


class SamplingFns(NamedTuple):
  """What `spade.sampling.Sampler` takes for one role (`Sampler(*fns, ...)`).

  tokens_to_logits(params, tokens, positions, input_mask, cache, cache_index)
  -> (float32 logits [B, V] of the LAST position, new cache), on parameters
  in the decoding layout that `prepare_params` makes once per call from the
  model's own (stacked) layout; init_cache(batch, length) -> cache;
  share_prefix: the granularity of prefix sharing the cache allows (0: none).
  """

  tokens_to_logits: Callable[..., tuple[Array, kv_cache.Cache]]
  init_cache: Callable[[int, int], kv_cache.Cache]
  prepare_params: Callable[[Params], Params]
  share_prefix: int


def sampling_fns(model_config, role: Role) -> SamplingFns:
  """The sampler's callables for one role: decoding runs `per_layer`.

  `prepare_params` unstacks the scanned layers once per sampler call (one
  copy of the layer weights), so the decode loop reads each layer's weights
  and cache in place instead of slicing them out of the stacks every step.
  With `config.model.scan_decode` the scanned model decodes on the stacked
  parameters as given (no copy; slower on CPU).
  """
  cfg = architecture.ModelConfig.from_config(model_config)
  per_layer = not cfg.scan_decode
  model = Transformer(cfg, per_layer=per_layer)
  role = Role(role)

  def tokens_to_logits(params, tokens, positions, input_mask, cache, index):
    logits, cache = model.apply(
        {"params": params},
        tokens,
        positions,
        role,
        input_mask=input_mask,
        cache=cache,
        cache_index=index,
        last_only=True,
    )
    return logits[:, -1], cache

  def make_cache(batch: int, length: int) -> kv_cache.Cache:
    return kv_cache.init_cache(cfg, batch, length, per_layer=per_layer)

  def decoding(params):
    params = decode_dtypes(layout.to_per_layer_layout(params, cfg), cfg)
    # Under a mesh's rules (the slot engine's `prepare`), the tables and
    # the MLP's kernels move to their decoding split (`fitted_shardings`).
    mesh, rules = jax.sharding.get_abstract_mesh(), nn.get_logical_axis_rules()
    if mesh.empty or not rules:
      return params
    where = fitted_shardings(params, mesh, rules)
    return jax.tree.map(jax.lax.with_sharding_constraint, params, where)

  unstack = jax.jit(decoding)

  def prepare_params(params: Params) -> Params:
    # Runs outside jit (the slot engine) or inside (the lock-step sampler):
    # a tree already in the decoding layout (`selfplay.engine.Engine` keeps
    # one while it samples) is returned as is, since a jitted identity
    # would copy every weight.
    if not per_layer or layout.is_per_layer(params):
      return params
    return unstack(params)

  # A prefix shared by a batch is prefilled once (`Sampler.share_prefix`,
  # in multiples of 64 tokens) when no layer keeps a ring buffer: the rows'
  # suffixes are left-padded after it, and padding written into a sliding
  # window's ring would evict keys the row still sees.
  share = 64 if cfg.sliding_window == 0 else 0
  return SamplingFns(tokens_to_logits, make_cache, prepare_params, share)
