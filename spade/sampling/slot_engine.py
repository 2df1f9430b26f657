"""A slot engine: the compiled programs of continuous batching.

JetStream's and MaxText's `maxengine` split serving into prefill, insert and
generate over an explicit decode state; this is that design over the same
model-agnostic callables as `spade.sampling.sampler.Sampler`
(`tokens_to_logits`, `init_cache`, `prepare_params`, STYLE.md rule 7). This
module is the device side only: the host scheduler that queues requests and
assigns slots is `spade.sampling.slot_server.SlotServer`.

`SlotEngine`, a frozen dataclass, holds three pure programs over a decode
state (`init`, `prefill_insert`, `generate`) and their compiled forms
(`SlotEngine.programs`), each compiled once per (slots, cache length,
prefill chunk, prefill rows, decode steps) and, for `prefill_insert` and
`generate`, once per window they run on (`SlotEngine.windows`: a bounded
handful) and, for `generate`, once per row count (`SlotEngine.rows`),
whatever the requests' lengths or arrival order:

* `init`: the decode state. `slots` rows of a KV cache of `cache_length`
  steps, and per slot the last token, the next position, tokens generated,
  the row's limit, whether it is live, whether it hit a stop id, and its
  request's key; plus one clock.
* `prefill_insert`: up to `prefill_rows` requests' prompts (or, for a
  returning episode, only the tokens after the history its slot still holds)
  are written `prefill_chunk` columns at a time into their destination
  slots' rows (sliced out of the decode state, not gathered), their first
  tokens drawn, and the rows written back in place (`dynamic_update_slice`
  into the donated state, not a scatter). Only the columns of the prompt's
  chunks run, and attention reads only the window of the cache that holds
  the rows' histories and new columns.
* `generate`: up to `decode_steps` tokens over every live slot (a
  `lax.while_loop` that stops once no slot is live, or, when the host asks,
  as soon as a row ends, so its slot is refilled at once); a finished row
  stops emitting at once and its slot is free for the host to refill.

Windows. A step's cost is mostly attention over the cache, and the live
rows' keys span only the last `held` cache times (`held`: the longest live
history). So each call runs on a window: the cache times [end - window,
end) gathered out of the ring once per call (`take`, mod cache_length), the
model stepped on that smaller cache (cache index = time - (end - window)),
and the steps the call wrote put back. The window is the smallest of
`SlotEngine.windows` (w and 3w/2 for w = `min_window` x 2^i, then the whole
cache) that holds the history and at least a quarter of a call's steps;
the call also stops when the window's room is spent. A key outside a
window is never one a live row attends to, so a windowed call samples what
the whole cache samples (float summation order aside). A window's
prefilled row empties the positions outside it (keys and values stay, never
attended). Ring-buffer models and `min_window=0` run on the whole cache.

Rows. A step's cost also grows with the rows it runs, live or not. With
`min_rows`, each call gathers the live slots (and, to fill the row count,
idle ones) into the smallest of `SlotEngine.rows` (min_rows, 3/2 x, 2 x,
3 x, ... below `slots`, then `slots`) that holds them, shard by shard (each
shard's live slots among its own rows, so no row crosses a device), runs
the loop on those rows and puts them back; a slot left out is not written
at all that call (its keys stay as they were, which only lengthens the
time a parked history stays intact). Under a mesh each chip takes and puts
its own rows (`jax.shard_map` over the batch axes), one slice and one
in-place update a row: a whole-array gather or scatter is what the SPMD
partitioner would make of it otherwise (a copy of every leaf in pieces, a
select over the whole cache). In place (`in_place`, by default on TPU) a
call on the whole cache takes nothing: the server first moves each
shard's live slots to its first rows (`swap`), and the loop reads and
writes those rows of the cache where they lie (`generate`'s `prefix`,
`kv_cache.row_prefix`).

Time and positions. Every slot writes its step-t key at cache time t (the
clock, one scalar: one compiled step serves every slot), so a global layer's
slot for time t is t % cache_length and a sliding layer's ring slot is
t % window, exactly as in the lock-step sampler. A prompt is placed so that
its last token sits at time clock - 1 (left padding before it, never
attended: its keys carry position -1), and its RoPE positions count only
the request's own tokens. Attention masks by position, so a row's keys may
sit anywhere in its buffer: a request's logits are those of a lock-step
batch of one up to float summation order. Dead slots are fed with
`input_mask` False, so what they write is never attended to.

Keys. A request carries its own PRNG key; its j-th token is drawn with
`fold_in(key, j)` from a draw of batch one. That is what the lock-step
sampler does for a batch of one given the same key (it folds in the step
and draws `uniform(key, (2, B, 1))`), so a request's tokens depend neither
on its slot, the clock, nor its neighbours, and equal the lock-step
sampler's for that request alone. (For B > 1 the lock-step draw of row i
depends on B and i, so a lock-step batch does not sample what the same
requests sample one by one; compare request by request.)

Continued rows. `prefill_insert` can start a row from a slot's row instead
of an empty cache: the slot's own history (an episode's next turn), moved
in time so it ends where the new columns begin (a slice of the row doubled,
not a gather), or another slot's prefix, with every key outside it emptied
(position -1). Only the tokens after it are prefilled, at positions that
continue it. Ring-buffer (sliding-window) models cannot: a parked slot's
dead writes evict its window (`SlotEngine.can_continue`). Which requests
continue which slot is the scheduler's choice.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from spade.model import mesh_fit
from spade.model import sharding
from spade.sampling import sampler as sampler_lib

Array = jax.Array
State = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Programs:
  """A `SlotEngine`'s compiled programs (`SlotEngine.programs`), each run
  under the engine's mesh rules; the state they take is donated.

  Attributes:
    init: () -> the empty decode state.
    prepare: params -> the parameters the programs take (once per params).
    prefill_insert: (params, state, rows, reqs, window) -> (state, (first
      tokens, their logprobs, live, hit)); see `SlotEngine.prefill_insert`.
    generate: (params, state, early, room, arm, window, index, prefix) ->
      (state, (tokens, logprobs, emitted, live, hit, steps)); see
      `SlotEngine.generate`.
    swap: (state, pairs) -> state, each shard's two slots swapped; see
      `SlotEngine.swap` (None: the server never moves a slot).
  """

  init: Callable[[], State]
  prepare: Callable[[Any], Any]
  prefill_insert: Callable[..., tuple[State, Any]]
  generate: Callable[..., tuple[State, Any]]
  swap: Callable[..., State] | None = None


def _per_shard(x, spec, shards):
  """x with its row axis (spec: (axis, entries per row)) split into
  (shards, rows per shard, entries per row)."""
  axis, per_row = spec
  s = x.shape
  return x.reshape(
      s[:axis] + (shards, s[axis] // (shards * per_row), per_row)
      + s[axis + 1 :]
  )  # fmt: skip


# The mesh axes a slot's row is sharded over (config.mesh.rules' "batch").
_ROW_MESH_AXES = ("data", "fsdp")


def _on_own_rows(mesh, f, spec, xs, index, *rest):
  """f(*xs, index, *rest) run on each chip's own rows (`jax.shard_map`,
  manual over the row axes only, the rest left to the partitioner): each
  x of `xs` holds its rows on `spec`'s axis, `index` (int32[shards, b])
  one line per chip, `rest` replicated. Run as one program over the
  whole array, a row put is a select over every chip's whole array (the
  partitioner cannot know an index falls in its own shard) and a row take
  a gather; here each is a local slice, as in `shard_map`'s examples."""
  row = jax.sharding.PartitionSpec(*(None,) * spec[0], _ROW_MESH_AXES)
  lines = jax.sharding.PartitionSpec(_ROW_MESH_AXES)
  rep = jax.sharding.PartitionSpec()
  return jax.shard_map(
      f, mesh=mesh, in_specs=(row,) * len(xs) + (lines,) + (rep,) * len(rest),
      out_specs=row, axis_names=frozenset(_ROW_MESH_AXES), check_vma=False,
  )(*xs, index, *rest)  # fmt: skip


def _slices_take(x, spec, index):
  """The rows `index` (int32[b]) names of x, one slice each, joined: what
  they hold is read once. (XLA's TPU gather of whole rows copies the whole
  operand in pieces first.)"""
  axis, per_row = spec
  return jnp.concatenate([
      jax.lax.dynamic_slice_in_dim(x, index[j] * per_row, per_row, axis)
      for j in range(index.shape[0])
  ], axis)  # fmt: skip


def _slices_put(x, y, spec, index):
  """x with the rows `index` (int32[b]) names set to y's, one in-place
  slice update each (y's rows in order)."""
  axis, per_row = spec
  for j in range(index.shape[0]):
    row = jax.lax.slice_in_dim(y, j * per_row, (j + 1) * per_row, axis=axis)
    x = jax.lax.dynamic_update_slice_in_dim(x, row, index[j] * per_row, axis)
  return x


def _rows_take(x, spec, index, mesh=None):
  """The rows `index` names (int32[shards, b]: each shard's own row
  indices) of x, shard by shard (no row crosses a shard): b per shard.
  With a mesh, each chip takes its own (`_on_own_rows`)."""
  if mesh is not None:
    return _on_own_rows(
        mesh, lambda x, ix: _slices_take(x, spec, ix[0]), spec, (x,), index
    )
  axis, _ = spec
  sh, b = index.shape
  s = x.shape
  y = jax.vmap(
      lambda ys, ix: jnp.take(ys, ix, axis=axis), in_axes=(axis, 0),
      out_axes=axis,
  )(_per_shard(x, spec, sh), index)  # fmt: skip
  return y.reshape(s[:axis] + (-1,) + s[axis + 1 :])


def _rows_swap(x, spec, pairs, mesh=None):
  """x with each shard's two rows pairs[k] = (a, b) (int32[shards, 2], its
  own row indices; a == b: none) swapped, one slice each way; with a
  mesh, each chip its own (`_on_own_rows`)."""

  def local(x, ab):
    a, b = ab[:1], ab[1:]
    ra, rb = _slices_take(x, spec, a), _slices_take(x, spec, b)
    return _slices_put(_slices_put(x, rb, spec, a), ra, spec, b)

  if mesh is not None:
    return _on_own_rows(mesh, lambda x, ix: local(x, ix[0]), spec, (x,), pairs)
  if pairs.shape[0] != 1:
    raise ValueError(f"one shard without a mesh, not {pairs.shape[0]}")
  return local(x, pairs[0])


def _slices_put_times(x, y, spec, index, t, starts, block):
  """x with the rows `index` (int32[b]) names set to y's (its rows in
  order) at the `block` times from each of `starts` (int32[k], on time
  axis `t`): k in-place slice updates a row."""
  axis, per_row = spec
  sizes = list(y.shape)
  sizes[axis], sizes[t] = per_row, block
  for j in range(index.shape[0]):
    for i in range(starts.shape[0]):
      # One slice of y moved straight into x's (a row cut out of y first
      # is a copy of the row).
      at = [jnp.int32(0)] * x.ndim
      at[axis], at[t] = jnp.int32(j * per_row), starts[i]
      part = jax.lax.dynamic_slice(y, at, sizes)
      at[axis] = index[j] * per_row
      x = jax.lax.dynamic_update_slice(x, part, at)
  return x


def _rows_put_times(x, y, spec, index, t, starts, block, mesh=None):
  """`_slices_put_times` on the rows `index` names (as for `_rows_take`),
  y holding them whole; with a mesh, each chip puts its own."""
  if mesh is not None:
    put = lambda x, y, ix, st: _slices_put_times(x, y, spec, ix[0], t, st,
                                                 block)  # fmt: skip
    return _on_own_rows(mesh, put, spec, (x, y), index, starts)
  sh = index.shape[0]
  per = x.shape[spec[0]] // (spec[1] * sh)  # rows a shard
  rows = (jnp.arange(sh, dtype=index.dtype)[:, None] * per + index).ravel()
  return _slices_put_times(x, y, spec, rows, t, starts, block)


def _rows_put(x, y, spec, index, t=None, steps=None, mesh=None):
  """x with the rows `index` names (as for `_rows_take`) set to y's; with
  a time axis `t` and `steps` (int32[n]; past the axis: dropped), only
  those times of the rows, y holding n steps on its time axis. With a
  mesh, each chip puts its own (`_on_own_rows`)."""
  if mesh is not None:
    if t is None:
      put = lambda x, y, ix: _slices_put(x, y, spec, ix[0])
      return _on_own_rows(mesh, put, spec, (x, y), index)
    put = lambda x, y, ix, steps: _rows_put(x, y, spec, ix, t, steps)
    return _on_own_rows(mesh, put, spec, (x, y), index, steps)
  axis, _ = spec
  sh = index.shape[0]
  xs = _per_shard(x, spec, sh)
  ys = _per_shard(y, spec, sh)

  def put(xk, yk, ix):
    if t is None:
      return xk.at[(slice(None),) * axis + (ix,)].set(yk, unique_indices=True)
    # Rows and times are two index arrays apart: their (b, n) comes first.
    tt = t + 1  # the rows' axis was split in two before the time axis
    where = [slice(None)] * xk.ndim
    where[axis], where[tt] = ix[:, None], steps[None, :]
    return xk.at[tuple(where)].set(
        jnp.moveaxis(yk, (axis, tt), (0, 1)), mode="drop",
        unique_indices=True,
    )  # fmt: skip

  out = jax.vmap(put, in_axes=(axis, axis, 0), out_axes=axis)(xs, ys, index)
  return out.reshape(x.shape)


@dataclasses.dataclass(frozen=True)
class SlotEngine:
  """The slot engine's programs and sizes (see the module docstring).

  Attributes:
    tokens_to_logits, init_cache, prepare_params: as for `Sampler`
      (`spade.model.transformer.sampling_fns(config.model, role)`), but
      `prepare_params` runs once per `SlotServer`, eagerly (it jits
      itself).
    pad_id: the token fed to dead slots and written after a row ends.
    stop_ids: a row ends after emitting one of these.
    slots: decode slots (the compiled batch; a multiple of the mesh's
      batch shards).
    cache_length: KV cache steps per slot; a request needs prompt +
      max_new_tokens <= this.
    prefill_chunk: prompt columns per prefill step (0: the whole cache
      length at once); `cache_length` must be a multiple of it.
    prefill_rows: requests one prefill writes (a multiple of the mesh's
      batch shards); a call with fewer runs filler rows, written nowhere.
    decode_steps: the most tokens per `generate` call (the host refills
      slots between calls; see `SlotServer.step` for returning early).
    min_window: the smallest live-cache window `generate` and
      `prefill_insert` attend over (`windows`); 0: always the whole cache.
    append_tokens: a returning turn that continues its slot and adds at
      most this many tokens to its history (the last reply's last token,
      the observation) is fed them through `generate`'s steps, beside the
      other slots' decoding, instead of a prefill-insert call (0: always a
      prefill).
    share_prefixes: a request whose prompt starts with at least a chunk of
      a prompt another slot still holds (live or parked) copies that
      prefix's cache into its row and prefills only the rest (the episodes
      of one environment share their first prompt).
    min_rows: `generate` runs on the live slots gathered into the smallest
      of `rows` (from min_rows in steps of 3/2 and 4/3, then `slots`) that
      holds them, shard by shard, so idle slots cost no decode steps (0:
      always every slot).
    max_gathered_rows: no gathered count above this (0: no cap): a call
      whose live slots need more runs on every slot. A gathered call on
      taken rows (not `runs_in_place`, or a window below the whole cache)
      takes their cache out and puts it back, so on a TPU slice a count
      near `slots` can read more a step than every slot does
      (`spade.compile --bytes_breakdown` prints where gathering stops
      paying).
    put_steps_from: a gathered call on the whole cache with at least
      this many rows a shard puts back only the slots its steps wrote;
      with fewer, its rows whole. (Compiled for TPU slices, the Gemma 3
      1B's and 12B's calls on 2-4 rows a chip read more with the
      steps-only put: XLA's memory-space assignment moved the loop's
      weights through more VMEM copies. From 6, every count read less:
      docs/scale.md.)
    in_place: the server moves a gathered call's live slots to the front
      of their shards (`swap`) and runs it on them where they lie
      (`generate`'s `prefix`), when the call is on the whole cache; None:
      on TPU only (`runs_in_place`: on CPU XLA copies the rows every step).
    temperature, top_k, top_p: as for `Sampler` (temperature 0: greedy).
    mesh, rules: optional mesh and its logical axis rules (`config.mesh.
      rules`; needed with a mesh, as for `Sampler`).
  """

  tokens_to_logits: Callable[..., tuple[Array, Any]]
  init_cache: Callable[[int, int], Any]
  prepare_params: Callable[[Any], Any] | None = None
  _: dataclasses.KW_ONLY
  pad_id: int
  stop_ids: tuple[int, ...] = ()
  slots: int = 8
  cache_length: int = 1024
  prefill_chunk: int = 128
  prefill_rows: int = 1
  decode_steps: int = 16
  min_window: int = 64
  share_prefixes: bool = True
  append_tokens: int = 32
  min_rows: int = 0
  max_gathered_rows: int = 0
  put_steps_from: int = 6
  in_place: bool | None = None
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  mesh: Any = None
  rules: tuple[Any, ...] = ()

  def __post_init__(self):
    chunk = self.chunk
    if self.cache_length % chunk:
      raise ValueError(
          f"cache_length={self.cache_length} is not a multiple of"
          f" prefill_chunk={self.prefill_chunk}: pick a chunk that divides it"
      )
    shards = self.batch_shards
    if self.slots % shards or self.prefill_rows % shards:
      raise ValueError(
          f"slots={self.slots} and prefill_rows={self.prefill_rows} must be"
          f" multiples of the mesh's batch shards (data*fsdp = {shards})"
      )
    if self.decode_steps < 1 or self.prefill_rows < 1:
      raise ValueError("decode_steps and prefill_rows must be >= 1")
    if self.append_tokens < 0:
      raise ValueError(f"append_tokens={self.append_tokens} must be >= 0")
    if self.min_window < 0:
      raise ValueError(f"min_window={self.min_window} must be >= 0")
    if self.min_rows < 0:
      raise ValueError(f"min_rows={self.min_rows} must be >= 0")
    if self.max_gathered_rows < 0:
      raise ValueError(
          f"max_gathered_rows={self.max_gathered_rows} must be >= 0"
      )
    if self.put_steps_from < 1:
      raise ValueError(f"put_steps_from={self.put_steps_from} must be >= 1")
    if self.mesh is not None and not self.rules:
      raise ValueError(
          "a mesh needs its logical axis rules: pass rules=config.mesh.rules"
      )
    if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
      raise ValueError(
          "need temperature >= 0, 0 < top_p <= 1, top_k >= 0; got"
          f" {self.temperature}, {self.top_p}, {self.top_k}"
      )

  @property
  def chunk(self) -> int:
    return self.prefill_chunk if self.prefill_chunk > 0 else self.cache_length

  @property
  def batch_shards(self) -> int:
    if self.mesh is None:
      return 1
    return int(self.mesh.shape["data"]) * int(self.mesh.shape["fsdp"])

  @functools.cached_property
  def _row_axes(self):
    return sampler_lib.row_axes(self.init_cache, self.cache_length)

  @functools.cached_property
  def _slot_axes(self):
    return sampler_lib.slot_axes(self.init_cache, self.cache_length)

  @functools.cached_property
  def _ring_axes(self):
    """`_slot_axes` with a sliding window's ring's too: from a cache of
    one step to one of two, every leaf's slot axis grows."""
    return sampler_lib.slot_axes(self.init_cache, 1)

  @functools.cached_property
  def runs_in_place(self) -> bool:
    """`in_place`, None resolved: whether the mesh's devices (or, without a
    mesh, JAX's default backend) are TPUs."""
    if self.in_place is not None:
      return self.in_place
    if self.mesh is not None:
      return self.mesh.devices.flat[0].platform == "tpu"
    return jax.default_backend() == "tpu"

  @functools.cached_property
  def can_continue(self) -> bool:
    """Whether a slot's cache can be continued: every cache leaf's size
    follows the cache length (no sliding window's ring within it)."""
    leaves = jax.tree.leaves(self._slot_axes, is_leaf=lambda x: x is None)
    return all(a is not None for a in leaves)

  @functools.cached_property
  def windows(self) -> tuple[int, ...]:
    """The cache windows the programs attend over, smallest first: `w` and
    `3w / 2` for w = `min_window` x 2^i below the cache length, then the
    cache length; at most 2 log2(cache_length / min_window) + 2 of them,
    each compiled once per program when first used. A call runs on the
    smallest that holds what it reads and writes. Only the whole cache
    when a cache leaf is a ring (`can_continue` is False: a ring slot is
    time % window, not a window's step) or `min_window` is 0."""
    c, w = self.cache_length, self.min_window
    if not self.can_continue or w <= 0:
      return (c,)
    out = []
    while w < c:
      out += [x for x in (w, w + w // 2) if x < c]
      w *= 2
    return tuple(sorted(set(out))) + (c,)

  @functools.cached_property
  def rows(self) -> tuple[int, ...]:
    """The row counts `generate` runs on, smallest first: `r` and `3r / 2`
    for r = `min_rows` x 2^i (rounded up to the mesh's batch shards) below
    `slots` and at most `max_gathered_rows` (when set), then `slots` (only
    `slots` when `min_rows` is 0). Each compiles once per window when
    first used."""
    s, sh, cap = self.slots, self.batch_shards, self.max_gathered_rows
    if self.min_rows <= 0:
      return (s,)
    per, b, out = s // sh, max(1, -(-self.min_rows // sh)), []
    while b < per:
      out += [x * sh for x in (b, b + b // 2) if x < per]
      b *= 2
    out = [x for x in out if not cap or x <= cap]
    return tuple(sorted(set(out))) + (s,)

  @functools.cached_property
  def traces(self) -> collections.Counter:
    """How often each program was traced (a retrace means a recompile)."""
    return collections.Counter()

  def _constrain(self, x, *names):
    if self.mesh is None:
      return x
    return nn.with_logical_constraint(x, names)

  def _vocab_split(self, vocab: int):
    """(rows, vocabulary) mesh axes of the decoding head's logits
    (`layers.decode_logits`) when the draw can take them where they lie
    (`sampler.sample_split`: greedy or top-k, each shard holding at least
    k words), else None."""
    if self.mesh is None:
      return None
    spec = sharding.logical_sharding(
        self.mesh, self.rules, "decode_batch", "decode_vocab"
    ).spec
    rows, axes = (tuple(spec) + (None, None))[:2]
    n = mesh_fit.split_ways(self.mesh, axes)
    axes = mesh_fit.axis_names(axes)
    k = 1 if self.temperature == 0 else self.top_k
    if n <= 1 or vocab % n or not 0 < k <= vocab // n:
      return None
    return rows, axes

  def _draw(self, keys, logits):
    """Per-row draws, each one of batch one: int32[R], float32[R]. Where the
    logits are split over the vocabulary (`_vocab_split`), each chip draws
    from its part and only the candidates cross the mesh."""
    greedy = self.temperature == 0
    split = self._vocab_split(logits.shape[-1])
    kwargs = dict(
        greedy=greedy,
        top_k=0 if greedy else self.top_k,
        use_top_p=(not greedy) and self.top_p < 1.0,
        temperature=jnp.float32(self.temperature if not greedy else 1.0),
        top_p=jnp.float32(self.top_p),
    )

    def one(key, row):
      tok, logp = sampler_lib.sample_logits(key, row[None], **kwargs)
      return tok[0], logp[0]

    if split is None:
      logits = self._constrain(logits, "batch", "vocab")
      return jax.vmap(one)(keys, logits)
    rows, axes = split
    spec = jax.sharding.PartitionSpec
    local = jax.shard_map(
        functools.partial(sampler_lib.sample_split, axes=axes, **kwargs),
        mesh=self.mesh,
        in_specs=(spec(rows), spec(rows, axes)),
        out_specs=(spec(rows), spec(rows)),
        check_vma=False,
    )
    return local(keys, logits)

  # ---------------------------------------------------------------- programs

  def init(self):
    """The decode state: every slot empty, the clock at `cache_length`."""
    self.traces["init"] += 1
    s = self.slots
    vec = lambda v, d: self._constrain(jnp.full((s,), v, d), "batch")
    return dict(
        cache=self.init_cache(s, self.cache_length),
        last=vec(self.pad_id, jnp.int32),
        pos=vec(0, jnp.int32),
        gen=vec(0, jnp.int32),
        limit=vec(0, jnp.int32),
        live=vec(False, bool),
        hit=vec(False, bool),
        keys=self._constrain(jnp.zeros((s, 2), jnp.uint32), "batch", None),
        # Tokens an appended turn feeds before it samples: feed[:, :nf],
        # fi of them fed so far.
        feed=self._constrain(
            jnp.zeros((s, max(self.append_tokens, 1)), jnp.int32),
            "batch",
            None,
        ),
        nf=vec(0, jnp.int32),
        fi=vec(0, jnp.int32),
        clock=jnp.int32(self.cache_length),
    )

  def prefill_insert(self, params, state, rows, reqs, window):
    """Prefills `rows` (per row: tokens int32[K, C] right-aligned, lengths,
    base positions, whether it continues its slot's history and that
    history's time shift; and the first chunk to run) into the slots
    `reqs` names (per row: destination slot (slots: none), key data,
    limit), in place, on the last `window` cache steps (one of `windows`,
    holding every row's history and new columns; see `_static_window`)."""
    self.traces["prefill_insert"] += 1
    tokens, lengths, base, cont, shift, first, src, span = rows
    del tokens, first, src, span
    dst, keys, limits = reqs
    cache, logits = self._prefill_window(
        self._static_window(window), params, rows, reqs, state
    )

    rng = jax.vmap(lambda d: jax.random.fold_in(jax.random.wrap_key_data(d), 0))
    tok, logp = self._draw(rng(keys), logits)
    stops = jnp.asarray(self.stop_ids or (-1,), jnp.int32)
    hit = jnp.any(tok[:, None] == stops[None, :], -1)
    live = ~hit & (limits > 1)

    del cont, shift
    new = dict(state, cache=cache)
    put = lambda name, v: new[name].at[dst].set(v, mode="drop")
    new["last"] = put("last", tok)
    new["pos"] = put("pos", base + lengths)
    new["gen"] = put("gen", jnp.ones_like(tok))
    new["limit"] = put("limit", limits)
    new["live"] = put("live", live)
    new["hit"] = put("hit", hit)
    new["nf"] = put("nf", jnp.zeros_like(tok))
    new["fi"] = put("fi", jnp.zeros_like(tok))
    new["keys"] = new["keys"].at[dst].set(keys, mode="drop")
    return new, self._everywhere((tok, logp, live, hit))

  def _prefill_window(self, window, params, rows, reqs, state):
    """`prefill_insert`'s prefill on a `window`-step view of the rows
    (cache times [clock - window, clock)): the new cache and the logits."""
    c, chunk = self.cache_length, self.chunk
    tokens, lengths, base, cont, shift, first, src, span = rows
    dst, _, _ = reqs
    k = tokens.shape[0]
    clock = state["clock"]
    row_axes, slot_axes = self._row_axes, self._slot_axes
    valid = dst < self.slots
    at = jnp.minimum(dst, self.slots - 1)
    whole = window == c
    # Cache time of the view's first step, and each row's steps in the
    # slot's ring: the view's step j is time w0 + j.
    w0 = clock - window
    steps = jnp.arange(window, dtype=jnp.int32)
    # A continued row keeps only the times [hi - span, hi) after its move,
    # hi = where the new columns begin: its own history, or the prefix it
    # shares with another slot's (whose later entries are not its own).
    hi = clock - (c - first * chunk)
    # The time of each step of the view: a window's step j is w0 + j; the
    # whole cache's ring slot i holds the time in [clock - c, clock) = i.
    times = w0 + steps if not whole else clock - c + (steps - clock) % c

    def start(x_state, x_fresh, spec, t):
      # Each row's source slot (its own, or the slot whose prefix it
      # shares; a slice, not a gather), its history moved `shift` steps
      # later in time (the whole cache: a roll, a slice of the row doubled;
      # a window: the window's steps gathered from `shift` earlier); fresh
      # rows take the empty cache.
      axis, per_row = spec

      def row(r, out):
        y = jax.lax.dynamic_slice_in_dim(
            x_state, src[r] * per_row, per_row, axis=axis
        )
        if t is not None:
          if whole:
            y = jnp.roll(y, shift[r], axis=t)
          else:
            y = jnp.take(y, (w0 + steps - shift[r]) % c, axis=t)
          if jnp.issubdtype(y.dtype, jnp.integer):
            kept = (times >= hi - span[r]) & (times < hi)
            kept = kept.reshape((1,) * t + (-1,) + (1,) * (y.ndim - t - 1))
            y = jnp.where(kept, y, -1)
        fresh = jax.lax.dynamic_slice_in_dim(out, r * per_row, per_row, axis)
        y = jnp.where(cont[r], y.astype(out.dtype), fresh)
        return jax.lax.dynamic_update_slice_in_dim(out, y, r * per_row, axis)

      # A loop, not k unrolled copies: the program's size (and its compile
      # time) does not grow with the rows.
      return jax.lax.fori_loop(0, k, row, x_fresh)

    cache = jax.tree.map(
        start, state["cache"], self.init_cache(k, window), row_axes, slot_axes
    )
    col = jnp.arange(c, dtype=jnp.int32)[None, :]
    pad = (c - lengths)[:, None]
    mask = col >= pad
    positions = base[:, None] + jnp.maximum(col - pad, 0)
    # Column `at` of the prompts is written at time clock - c + at: the
    # whole cache takes times (its ring slot is time % c), a window its own
    # steps.
    offset = clock - c if whole else window - c

    logits, cache = sampler_lib.prefill_chunks(
        self.tokens_to_logits, params, tokens, positions, mask, cache, offset,
        chunk=chunk, first=first, stop=c // chunk,
    )  # fmt: skip
    ring = (w0 + steps) % c

    def insert(x_state, x_new, spec, t):
      # Row by row, in place in the (donated) state; a filler row (no
      # destination) writes back what its slot holds. A window's row keeps
      # nothing else of what its slot held: positions outside the window
      # are emptied (-1, never attended), keys and values left as they are.
      axis, per_row = spec

      def row(r, x_state):
        new = jax.lax.dynamic_slice_in_dim(x_new, r * per_row, per_row, axis)
        old = jax.lax.dynamic_slice_in_dim(
            x_state, at[r] * per_row, per_row, axis=axis
        )
        if not whole:
          held = old
          if jnp.issubdtype(old.dtype, jnp.integer):
            held = jnp.full_like(old, -1)
          new = held.at[(slice(None),) * t + (ring,)].set(
              new, unique_indices=True
          )
        return jax.lax.dynamic_update_slice_in_dim(
            x_state, jnp.where(valid[r], new, old), at[r] * per_row, axis=axis
        )

      return jax.lax.fori_loop(0, k, row, x_state)

    cache = jax.tree.map(insert, state["cache"], cache, row_axes, slot_axes)
    return cache, logits

  def generate(
      self, params, state, early, room, arm, window, index=None, prefix=0
  ):
    """Up to `decode_steps` tokens over every slot, stopping once no slot is
    live, or, with `early` (a bool scalar: no recompile), once a slot ends,
    on the cache steps [clock + room - window, clock + room) (`window` one
    of `windows`, see `_static_window`; `room`, an int32 scalar, the steps left
    after every live row's history: the loop also stops when they are
    spent; the whole cache never runs out). `arm` (per slot: whether a
    returning turn starts there, its tokens to feed int32[S, F] and their
    count, its key data and limit) starts appended turns first. `index`
    (int32[shards, b], each shard's own slot indices; None: every slot)
    names the slots the loop runs on, gathered out of the state and put
    back (one compile per its shape); or `prefix` (static, a multiple of
    `batch_shards`, on the whole cache only) the first `prefix /
    batch_shards` slots of each shard, the loop reading and writing their
    cache where it lies (`kv_cache.row_prefix`): no take, no put. Returns
    the new state and
    (tokens int32[S, n], logprobs float32[S, n], tokens each slot emitted,
    live, hit, steps that ran)."""
    self.traces["generate"] += 1
    s, n = self.slots, self.decode_steps
    armed, feed, count, keys, limits = arm
    zero = jnp.zeros_like(state["gen"])
    pick = lambda new, old: jnp.where(
        armed.reshape((-1,) + (1,) * (old.ndim - 1)), new, old
    )
    state = dict(
        state,
        feed=pick(feed, state["feed"]),
        nf=pick(count, state["nf"]),
        fi=pick(zero, state["fi"]),
        gen=pick(zero, state["gen"]),
        limit=pick(limits, state["limit"]),
        live=pick(jnp.ones_like(state["live"]), state["live"]),
        hit=pick(jnp.zeros_like(state["hit"]), state["hit"]),
        keys=pick(keys, state["keys"]),
    )
    window = self._static_window(window)
    if prefix:
      self._check_prefix(prefix, window, index)
    rows = prefix or (s if index is None else index.size)
    vec = (0, 1)
    names = [k for k in state if k not in ("cache", "clock")]
    sub = state
    if prefix:
      sub = dict(state, **{k: self._prefix(state[k], prefix) for k in names})
    elif index is not None:
      sub = dict(state, **{
          k: _rows_take(state[k], vec, index, self.mesh) for k in names
      })  # fmt: skip
    toks = self._constrain(jnp.full((rows, n), self.pad_id, jnp.int32),
                           "batch", None)  # fmt: skip
    lps = self._constrain(jnp.zeros((rows, n), jnp.float32), "batch", None)
    before = state["gen"]
    out, toks, lps, steps = self._generate_window(
        window, params, early, room, index, (sub, toks, lps),
    )  # fmt: skip
    if prefix:
      out = dict(out, **{
          k: self._prefix_put(state[k], out[k]) for k in names
      })  # fmt: skip
      full = lambda v, y: self._prefix_put(jnp.full((s, n), v, y.dtype), y)
      toks, lps = full(self.pad_id, toks), full(0, lps)
    elif index is not None:
      out = dict(
          out, **{
              k: _rows_put(state[k], out[k], vec, index, mesh=self.mesh)
              for k in names
          }
      )  # fmt: skip
      full = lambda v, y: _rows_put(jnp.full((s, n), v, y.dtype), y, vec,
                                    index, mesh=self.mesh)  # fmt: skip
      toks, lps = full(self.pad_id, toks), full(0, lps)
    state = out
    emitted = state["gen"] - before
    return state, self._everywhere(
        (toks, lps, emitted, state["live"], state["hit"], steps)
    )

  def swap(self, state, pairs):
    """The state with each shard's two slots pairs[k] = (a, b) (int32[shards,
    2], its own slot indices; a == b: none) swapped: their cache rows and
    every other entry, so what a slot holds moves with it (the server
    moves live slots to the front of their shards, for `generate`'s
    `prefix`). Reads and writes the two rows, nothing else."""
    self.traces["swap"] += 1
    one = lambda x, spec: _rows_swap(x, spec, pairs, self.mesh)
    rest = {
        k: one(v, (0, 1)) for k, v in state.items()
        if k not in ("cache", "clock")
    }  # fmt: skip
    return dict(
        state, cache=jax.tree.map(one, state["cache"], self._row_axes), **rest
    )

  def _check_prefix(self, prefix, window, index) -> None:
    """ValueError unless `prefix` is a gathered count on the whole cache."""
    if index is not None or window != self.cache_length:
      raise ValueError(
          "generate's prefix runs on the whole cache without an index; got"
          f" window={window}, index={index!r}"
      )
    if prefix not in self.rows or prefix >= self.slots:
      raise ValueError(
          f"prefix={prefix} is not one of the gathered counts {self.rows[:-1]}"
      )

  def _by_shard(self, x):
    """x [slots, ...] as [shards, slots a shard, ...] (a view)."""
    sh = self.batch_shards
    x = x.reshape((sh, x.shape[0] // sh) + x.shape[1:])
    return self._constrain(x, "batch", *(None,) * (x.ndim - 1))

  def _prefix(self, x, prefix):
    """The first `prefix / batch_shards` rows of each shard of x [slots,
    ...], `prefix` rows."""
    b = prefix // self.batch_shards
    y = jax.lax.slice_in_dim(self._by_shard(x), 0, b, axis=1)
    return self._constrain(y.reshape((prefix,) + x.shape[1:]), "batch",
                           *(None,) * (x.ndim - 1))  # fmt: skip

  def _prefix_put(self, x, y):
    """x with the first rows of each shard set to y's (`_prefix`'s rows)."""
    view, sh = self._by_shard(x), self.batch_shards
    y = y.reshape((sh, y.shape[0] // sh) + y.shape[1:])
    at = (jnp.int32(0),) * view.ndim
    return jax.lax.dynamic_update_slice(view, y, at).reshape(x.shape)

  def _generate_window(self, window, params, early, room, index, operands):
    """`generate`'s loop on a `window`-step view of the cache (cache times
    [clock + room - window, clock + room)); the state's other entries hold
    only the rows `index` names (all: None; with neither, on the whole
    cache, a `prefix` of each shard's), the cache all."""
    state, toks, lps = operands
    c, n = self.cache_length, self.decode_steps
    stops = jnp.asarray(self.stop_ids or (-1,), jnp.int32)
    fold = jax.vmap(
        lambda d, j: jax.random.fold_in(jax.random.wrap_key_data(d), j)
    )
    started = state["live"]
    whole = window == c
    # The cache index of time t: t itself for the whole cache (its ring
    # slot is t % c), t - w0 in a window whose step j is time w0 + j.
    clock = state["clock"]
    w0 = jnp.int32(0) if whole else clock + room - window
    most = n if whole else jnp.minimum(n, room)
    full = state["cache"]
    rows = lambda x, spec: (
        x if index is None else _rows_take(x, spec, index, self.mesh)
    )
    if not whole:
      ring = w0 + jnp.arange(window, dtype=jnp.int32)  # taken mod c
      take = lambda x, spec, t: rows(
          jnp.take(x, ring, axis=t, mode="wrap"), spec
      )
      state = dict(state, cache=jax.tree.map(
          take, full, self._row_axes, self._slot_axes
      ))  # fmt: skip
    elif index is not None:
      state = dict(state, cache=jax.tree.map(rows, full, self._row_axes))

    def cond(carry):
      i, st, _, _ = carry
      ended = jnp.any(started & ~st["live"])
      return (i < most) & jnp.any(st["live"]) & ~(early & ended)

    def body(carry):
      i, st, toks, lps = carry
      live = st["live"]
      # An appended turn feeds its tokens first; the step that feeds the
      # last of them samples its first token.
      forcing = live & (st["fi"] < st["nf"])
      fed = jnp.take_along_axis(
          st["feed"],
          jnp.minimum(st["fi"], st["feed"].shape[1] - 1)[:, None],
          axis=1,
      )[:, 0]
      inp = jnp.where(forcing, fed, st["last"])
      emit = live & (st["fi"] >= st["nf"] - 1)
      logits, cache = self.tokens_to_logits(
          params, inp[:, None], st["pos"][:, None], live[:, None],
          st["cache"], st["clock"] - w0,
      )  # fmt: skip
      tok, logp = self._draw(fold(st["keys"], st["gen"]), logits)
      toks = toks.at[:, i].set(jnp.where(emit, tok, self.pad_id))
      lps = lps.at[:, i].set(jnp.where(emit, logp, 0.0))
      gen = st["gen"] + emit.astype(jnp.int32)
      hit = emit & jnp.any(tok[:, None] == stops[None, :], -1)
      st = dict(
          st,
          cache=cache,
          last=jnp.where(emit, tok, st["last"]),
          pos=st["pos"] + live.astype(jnp.int32),
          gen=gen,
          fi=st["fi"] + forcing.astype(jnp.int32),
          live=live & ~hit & (gen < st["limit"]),
          hit=st["hit"] | hit,
          clock=st["clock"] + 1,
      )
      return i + 1, st, toks, lps

    steps, state, toks, lps = jax.lax.while_loop(
        cond, body, (jnp.int32(0), state, toks, lps)
    )
    # Only the call's own steps were written: they go back to their ring
    # slots (past `most`: nowhere), the rest of the rows as it was. On the
    # whole cache, a gathered call with fewer than `put_steps_from` rows a
    # shard puts its rows back whole.
    if not whole or index is not None:
      j = jnp.arange(n, dtype=jnp.int32)

      def put(x, y, spec, t):
        if whole and index.shape[1] < self.put_steps_from:
          return _rows_put(x, y, spec, index, mesh=self.mesh)
        if whole:
          # y holds the rows whole, so any of their slots can go back: the
          # call's `n` from its first (up to the ring's end, where a slice
          # stops) and the first `n`, which hold the rest of a call that
          # wrapped. (A sliding layer's ring no longer than the call goes
          # back whole.)
          size = x.shape[t]
          block = min(n, size)
          starts = [jnp.minimum(clock % size, size - block)]
          starts = jnp.stack(starts + [jnp.int32(0)] * (block < size))
          return _rows_put_times(x, y, spec, index, t, starts, block,
                                 self.mesh)  # fmt: skip
        src = jnp.minimum(clock - w0 + j, window - 1)
        dst = jnp.where(j < most, (clock + j) % c, c + j)
        y = jnp.take(y, src, axis=t, mode="wrap")
        if index is not None:
          return _rows_put(x, y, spec, index, t, dst, self.mesh)
        return x.at[(slice(None),) * t + (dst,)].set(
            y, mode="drop", unique_indices=True
        )

      state = dict(state, cache=jax.tree.map(
          put, full, state["cache"], self._row_axes, self._ring_axes
      ))  # fmt: skip
    return state, toks, lps, steps

  def window(self, need: int) -> int:
    """The smallest of `windows` that holds `need` cache steps (the whole
    cache when none does)."""
    return next((w for w in self.windows if w >= need), self.cache_length)

  def _static_window(self, window) -> int:
    """`window` as an int, one of `windows`: the programs take it static
    (the scheduler and `spade.compile` pass an int: one program per window)."""
    if not isinstance(window, (int, np.integer)):
      raise TypeError(
          f"window must be a static int, one of {self.windows}; got"
          f" {window!r}: jit the engine's programs with it in static_argnums"
      )
    if int(window) not in self.windows:
      raise ValueError(f"window={window} is not one of {self.windows}")
    return int(window)

  def _everywhere(self, tree):
    """Small outputs replicated, so every process reads all of them."""
    if self.mesh is None:
      return tree
    rep = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
    return jax.lax.with_sharding_constraint(tree, rep)

  # -------------------------------------------------------------- compiled

  def _call(self, fn, *args):
    if self.mesh is None:
      return fn(*args)
    with sharding.use_rules(self.mesh, self.rules):
      return fn(*args)

  @functools.cached_property
  def programs(self) -> Programs:
    """The programs (init, prefill-insert, generate and swap jitted;
    prepare as given), each run under the mesh's rules; the decode state
    is donated and keeps the shardings `init` gave it, and the window (and
    `generate`'s `prefix`) is static: one compile per window (and
    prefix)."""
    init = jax.jit(self.init)
    out = None
    if self.mesh is not None:
      out = jax.tree.map(lambda x: x.sharding, self._call(init))
    # Called as given, not jitted: a prepare that changes nothing (params
    # already in its layout) must not copy them; one that computes jits
    # itself (`transformer.sampling_fns`).
    prepare = self.prepare_params or (lambda p: p)
    shardings = {} if out is None else dict(out_shardings=(out, None))
    prefill = jax.jit(
        self.prefill_insert, donate_argnums=1, static_argnums=4, **shardings
    )
    generate = jax.jit(
        self.generate, donate_argnums=1, static_argnums=(5, 7), **shardings
    )
    swap = jax.jit(self.swap, donate_argnums=0, **(
        {} if out is None else dict(out_shardings=out)
    ))  # fmt: skip
    run = lambda fn: functools.partial(self._call, fn)
    return Programs(
        run(init), run(prepare), run(prefill), run(generate), run(swap)
    )
