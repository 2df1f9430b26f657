"""A slot engine: continuous batching over a fixed set of decode slots.

JetStream's and MaxText's `maxengine` split serving into prefill, insert and
generate over an explicit decode state; this is that design over the same
model-agnostic callables as `spade.sampling.sampler.Sampler`
(`tokens_to_logits`, `init_cache`, `prepare_params`, STYLE.md rule 7).

Device side (`Engine`, a frozen dataclass; three compiled programs, each
compiled once per (slots, cache length, prefill chunk, prefill rows, decode
steps) and, for `prefill_insert` and `generate`, once per window they run
on (`Engine.windows`: a bounded handful) and, for `generate`, once per row
count (`Engine.rows`), whatever the requests' lengths or arrival order):

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
`Engine.windows` (w and 3w/2 for w = `min_window` x 2^i, then the whole
cache) that holds the history and at least a quarter of a call's steps;
the call also stops when the window's room is spent. A key outside a
window is never one a live row attends to, so a windowed call samples what
the whole cache samples (float summation order aside). A window's
prefilled row empties the positions outside it (keys and values stay, never
attended). Ring-buffer models and `min_window=0` run on the whole cache.

Rows. A step's cost also grows with the rows it runs, live or not. With
`min_rows`, each call gathers the live slots (and, to fill the row count,
idle ones) into the smallest of `Engine.rows` (min_rows, 3/2 x, 2 x, 3 x,
... below `slots`, then `slots`) that holds them, shard by shard (each
shard's live slots among its own rows, so no row crosses a device), runs
the loop on those rows and puts them back; a slot left out is not written
at all that call (its keys stay as they were, which only lengthens the
time a parked history stays intact). `decode_row_steps` counts the rows
that ran.

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

Carried caches. When a request's slot ends, the slot still holds its
history (the prompt and every sampled token but the last) until another
request takes it. A request whose `key` names that episode, whose prompt
extends that history, and that arrives while the history is intact (the
clock has not lapped it: dead writes have not reached it) continues it:
the slot's row is rolled in time so the history ends where the new
tokens begin (a slice of the row doubled, not a gather), and only the tokens after it are prefilled, at positions that
continue it. Otherwise the whole prompt is prefilled again. Ring-buffer
(sliding-window) models always re-prefill: the dead writes of a parked slot
evict its window (`Engine.can_continue`).

Shared prefixes. A request that does not continue its own slot may start
with at least a chunk of the contiguous first prompt another slot still
holds (live, or parked and not lapped): the episodes of one environment
share their first prompt. Its row then takes that slot's row, moved in time
so the prefix ends where its new columns begin, with every key outside the
prefix emptied (position -1), and only the rest of its prompt is
prefilled, at positions after the prefix (`Engine.share_prefixes`; the
counters `requests_shared`, `tokens_shared`). Lock-step's sampler prefills
identical first prompts once; this is the same saving for prompts that
arrive at different times and share only a prefix.

Host side (`Server`, made by `Engine.start(params)`): a request queue;
each `step()` fills free slots, runs one `generate`, and hands back the
requests that ended; the `generate` returns as soon as a row ends when
requests are queued (or `step(early=True)`; `run` with an `on_result`
asks for it, since the callback may queue the episode's next turn). With `carry_first` (the default) a returning episode
that can continue its own free slot is served before the queue's head;
otherwise first come, first served, and with more episodes than slots their
histories are evicted. Counters: `decode_row_steps` (rows x steps that
ran, live or not, plus the `prefill_rows` rows of every prefill's
first-token draw, fillers included) and
`tokens_generated`;
`padding_ratio = decode_row_steps / tokens_generated`. `lockstep_row_steps`
counts a lock-step `SampleOutput` the same way.

Users. `spade.agent.rollout` plays every episode of an iteration through a
`Server`, wrapped by `spade.selfplay.engine.TextServer` (its `TurnServer`,
which draws turn t of episode i with `fold_in(fold_in(key(seed), i), t)`):
one `Request` per live episode keyed by the episode id; `step()` in a
loop; each ended turn handed to a sandbox worker thread while the other
slots decode, and the next prompt submitted with the same key, so an exact
episode continues in its slot while the slot is still its own and a
truncated one is prefilled whole. Turn limits, hints, the EOS and context
rules stay in the rollout. `spade.selfplay.engine.Engine.sample` (the
designer's programs, the hint writer) queues its prompts on a `TextServer`
the same way.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import time
from typing import Any, Callable, Hashable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from spade import config as config_lib
from spade.model import sharding
from spade.sampling import sampler as sampler_lib

Array = jax.Array


def lockstep_row_steps(out: sampler_lib.SampleOutput) -> int:
  """Decode row-steps a lock-step sampler call ran: every row, for as many
  steps as its longest row generated (the loop stops when all are done;
  the first token's draw after the prefill counts as a step)."""
  return int(out.tokens.shape[0]) * int(np.max(out.lengths, initial=0))


@dataclasses.dataclass(frozen=True)
class Request:
  """One sampling request.

  Attributes:
    key: names the request's episode; a later request with the same key
      whose prompt extends this one's prompt and reply continues its cache.
    prompt: the whole prompt's token ids (the full history).
    max_new_tokens: the most tokens to generate (>= 1).
    rng: this request's PRNG key (typed); the same key gives the same
      tokens whatever slot or step the request runs in.
  """

  key: Hashable
  prompt: Sequence[int]
  max_new_tokens: int
  rng: Array


@dataclasses.dataclass(frozen=True)
class Result:
  """What a request returned.

  Attributes:
    request: the request.
    tokens: int32[n] generated ids (a stop id, when hit, is the last).
    logprobs: float32[n], log_softmax of the raw logits at each token.
    finished: a stop id was emitted.
    slot: the slot it ran in.
    carried: prompt tokens taken from a cache instead of prefilled (its
      slot's history, or another slot's shared prefix).
  """

  request: Request
  tokens: np.ndarray
  logprobs: np.ndarray
  finished: bool
  slot: int
  carried: int


def _split(x, spec):
  """x with its row axis split into (rows, entries per row)."""
  axis, per_row = spec
  s = x.shape
  return x.reshape(s[:axis] + (s[axis] // per_row, per_row) + s[axis + 1 :])


def _merge(y, spec):
  axis, _ = spec
  s = y.shape
  return y.reshape(s[:axis] + (s[axis] * s[axis + 1],) + s[axis + 2 :])


def _per_shard(x, spec, shards):
  """x with its row axis (spec: (axis, entries per row)) split into
  (shards, rows per shard, entries per row)."""
  axis, per_row = spec
  s = x.shape
  return x.reshape(
      s[:axis] + (shards, s[axis] // (shards * per_row), per_row)
      + s[axis + 1 :]
  )  # fmt: skip


def _rows_take(x, spec, index):
  """The rows `index` names (int32[shards, b]: each shard's own row
  indices) of x, shard by shard (no row crosses a shard): b per shard."""
  axis, _ = spec
  sh, b = index.shape
  s = x.shape
  y = jax.vmap(
      lambda ys, ix: jnp.take(ys, ix, axis=axis), in_axes=(axis, 0),
      out_axes=axis,
  )(_per_shard(x, spec, sh), index)  # fmt: skip
  return y.reshape(s[:axis] + (-1,) + s[axis + 1 :])


def _rows_put(x, y, spec, index, t=None, steps=None):
  """x with the rows `index` names (as for `_rows_take`) set to y's; with
  a time axis `t` and `steps` (int32[n]; past the axis: dropped), only
  those times of the rows, y holding n steps on its time axis."""
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
class Engine:
  """The device side of the slot engine (see the module docstring).

  Attributes:
    tokens_to_logits, init_cache, prepare_params: as for `Sampler`
      (`spade.model.transformer.sampling_fns(config.model, role)`), but
      `prepare_params` runs once per `start`, eagerly (it jits itself).
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
      slots between calls; see `Server.step` for returning early).
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
    temperature, top_k, top_p: as for `Sampler` (temperature 0: greedy).
    mesh, rules: optional mesh and logical axis rules (as for `Sampler`).
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
    # pylint: disable-next=protected-access
    return sampler_lib._row_axes(self.init_cache, self.cache_length)

  @functools.cached_property
  def _slot_axes(self):
    # pylint: disable-next=protected-access
    return sampler_lib._slot_axes(self.init_cache, self.cache_length)

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
    `slots`, then `slots` (only `slots` when `min_rows` is 0). Each
    compiles once per window when first used."""
    s, sh = self.slots, self.batch_shards
    if self.min_rows <= 0:
      return (s,)
    per, b, out = s // sh, max(1, -(-self.min_rows // sh)), []
    while b < per:
      out += [x * sh for x in (b, b + b // 2) if x < per]
      b *= 2
    return tuple(sorted(set(out))) + (s,)

  @functools.cached_property
  def traces(self) -> collections.Counter:
    """How often each program was traced (a retrace means a recompile)."""
    return collections.Counter()

  @property
  def _rules(self):
    return self.rules or config_lib.base_config().mesh.rules

  def _constrain(self, x, *names):
    if self.mesh is None:
      return x
    return nn.with_logical_constraint(x, names)

  def _draw(self, keys, logits):
    """Per-row draws, each one of batch one: int32[R], float32[R]."""
    greedy = self.temperature == 0

    def one(key, row):
      tok, logp = sampler_lib.sample_logits(
          key,
          row[None],
          greedy=greedy,
          top_k=0 if greedy else self.top_k,
          use_top_p=(not greedy) and self.top_p < 1.0,
          temperature=jnp.float32(self.temperature if not greedy else 1.0),
          top_p=jnp.float32(self.top_p),
      )
      return tok[0], logp[0]

    return jax.vmap(one)(keys, logits)

  # ---------------------------------------------------------------- programs

  def _init(self):
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

  def _prefill_insert(self, params, state, rows, reqs, window):
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
    """`_prefill_insert`'s prefill on a `window`-step view of the rows
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

    def one(i, carry):
      _, cache = carry
      at = i * chunk

      def cols(x):
        return jax.lax.dynamic_slice_in_dim(x, at, chunk, axis=1)

      return self.tokens_to_logits(
          params, cols(tokens), cols(positions), cols(mask), cache,
          offset + at,
      )  # fmt: skip

    logits = jax.eval_shape(
        lambda cc: self.tokens_to_logits(
            params, tokens[:, :chunk], positions[:, :chunk],
            mask[:, :chunk], cc, clock,
        )[0],
        cache,
    )  # fmt: skip
    logits = jnp.zeros(logits.shape, logits.dtype)
    logits, cache = jax.lax.fori_loop(first, c // chunk, one, (logits, cache))
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

  def _generate(self, params, state, early, room, arm, window, index=None):
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
    back (one compile per its shape). Returns the new state and
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
    rows = s if index is None else index.size
    vec = (0, 1)
    names = [k for k in state if k not in ("cache", "clock")]
    sub = state
    if index is not None:
      sub = dict(state, **{k: _rows_take(state[k], vec, index) for k in names})
    toks = self._constrain(jnp.full((rows, n), self.pad_id, jnp.int32),
                           "batch", None)  # fmt: skip
    lps = self._constrain(jnp.zeros((rows, n), jnp.float32), "batch", None)
    before = state["gen"]
    out, toks, lps, steps = self._generate_window(
        self._static_window(window), params, early, room, index,
        (sub, toks, lps),
    )  # fmt: skip
    if index is not None:
      out = dict(
          out, **{k: _rows_put(state[k], out[k], vec, index) for k in names}
      )
      full = lambda v, y: _rows_put(jnp.full((s, n), v, y.dtype), y, vec,
                                    index)  # fmt: skip
      toks, lps = full(self.pad_id, toks), full(0, lps)
    state = out
    emitted = state["gen"] - before
    return state, self._everywhere(
        (toks, lps, emitted, state["live"], state["hit"], steps)
    )

  def _generate_window(self, window, params, early, room, index, operands):
    """`_generate`'s loop on a `window`-step view of the cache (cache times
    [clock + room - window, clock + room)); the state's other entries hold
    only the rows `index` names (all: None), the cache all."""
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
    rows = lambda x, spec: x if index is None else _rows_take(x, spec, index)
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
    if not whole:
      # Only the call's own steps were written: the window's steps from
      # clock - w0 go back to their ring slots (past `most`: nowhere).
      j = jnp.arange(n, dtype=jnp.int32)
      src = jnp.minimum(clock - w0 + j, window - 1)
      dst = jnp.where(j < most, (clock + j) % c, c + j)

      def put(x, y, spec, t):
        y = jnp.take(y, src, axis=t, mode="wrap")
        if index is not None:
          return _rows_put(x, y, spec, index, t, dst)
        return x.at[(slice(None),) * t + (dst,)].set(
            y, mode="drop", unique_indices=True
        )

      state = dict(state, cache=jax.tree.map(
          put, full, state["cache"], self._row_axes, self._slot_axes
      ))  # fmt: skip
    elif index is not None:
      state = dict(state, cache=jax.tree.map(
          lambda x, y, spec: _rows_put(x, y, spec, index), full,
          state["cache"], self._row_axes,
      ))  # fmt: skip
    return state, toks, lps, steps

  def window(self, need: int) -> int:
    """The smallest of `windows` that holds `need` cache steps (the whole
    cache when none does)."""
    return next((w for w in self.windows if w >= need), self.cache_length)

  def _static_window(self, window) -> int:
    """`window` as an int, one of `windows`: the programs take it static
    (the server and `spade.compile` pass an int: one program per window)."""
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

  # ------------------------------------------------------------- host side

  def _call(self, fn, *args):
    if self.mesh is None:
      return fn(*args)
    with sharding.use_rules(self.mesh, self._rules):
      return fn(*args)

  @functools.cached_property
  def _programs(self):
    """(init, prepare, prefill_insert, generate), jitted; the decode state
    is donated and keeps the shardings `init` gave it."""
    init = jax.jit(self._init)
    out = None
    if self.mesh is not None:
      out = jax.tree.map(lambda x: x.sharding, self._call(init))
    # Called as given, not jitted: a prepare that changes nothing (params
    # already in its layout) must not copy them; one that computes jits
    # itself (`transformer.sampling_fns`).
    prepare = self.prepare_params or (lambda p: p)
    # The window (the last argument) is static: one compile per window.
    if out is None:
      prefill = jax.jit(
          self._prefill_insert, donate_argnums=1, static_argnums=4
      )
      generate = jax.jit(self._generate, donate_argnums=1, static_argnums=5)
    else:
      prefill = jax.jit(
          self._prefill_insert, donate_argnums=1, static_argnums=4,
          out_shardings=(out, None),
      )  # fmt: skip
      generate = jax.jit(
          self._generate, donate_argnums=1, static_argnums=5,
          out_shardings=(out, None),
      )  # fmt: skip
    return init, prepare, prefill, generate

  def start(self, params, carry_first: bool = True) -> "Server":
    """A server over these params (prepared once, e.g. unstacked); see
    `Server._assign` for `carry_first`."""
    init, prepare, _, _ = self._programs
    return Server(
        self, self._call(prepare, params), self._call(init), carry_first
    )


@dataclasses.dataclass
class _Slot:
  """Host view of one slot."""

  request: Request | None = None  # while live
  tokens: list[int] = dataclasses.field(default_factory=list)
  logprobs: list[float] = dataclasses.field(default_factory=list)
  carried: int = 0
  # The episode whose history the slot holds (after its request ended):
  # its tokens, and the cache times of its first and one-past-last entry.
  holder: Hashable = None
  history: tuple[int, ...] = ()
  first: int = 0
  end: int = 0
  freed_at: int = 0
  # Tokens the row holds contiguously from cache time `prefix_first` (its
  # first prompt, or what of it is contiguous), for other requests to share.
  prefix: tuple[int, ...] = ()
  prefix_first: int = 0
  # An appended turn's tokens still to feed before its first sample.
  feeding: int = 0


class Server:
  """The host loop of the slot engine: a queue, slots, counters."""

  def __init__(self, engine: Engine, params, state, carry_first: bool = True):
    self.engine = engine
    self.carry_first = carry_first
    self.params = params
    self.state = state
    self.clock = engine.cache_length  # mirrors state["clock"]
    self.queue: collections.deque[Request] = collections.deque()
    self.slots = [_Slot() for _ in range(engine.slots)]
    self._held: dict[Hashable, int] = {}  # episode key -> slot
    self._frees = 0
    # Counters (see the module docstring).
    self.decode_row_steps = 0
    self.tokens_generated = 0
    self.prefill_calls = 0
    self.prefill_columns = 0  # rows x columns the prefills wrote
    self.tokens_carried = 0
    self.requests_carried = 0
    self.tokens_shared = 0  # prompt tokens copied from another slot's prefix
    self.requests_shared = 0
    self.requests_appended = 0  # returning turns fed through generate
    self.tokens_appended = 0
    self._arming: list[tuple[int, Request, list[int]]] = []
    self.generate_calls = 0
    self.window_row_steps = 0  # slots x steps x window steps attended
    self.windows = collections.Counter()  # generate calls per window
    self.rows = collections.Counter()  # generate calls per row count
    self.seconds = 0.0
    self.prefill_seconds = 0.0  # of `seconds`, in prefill-insert calls

  @property
  def padding_ratio(self) -> float:
    return self.decode_row_steps / max(self.tokens_generated, 1)

  @property
  def live(self) -> int:
    return sum(s.request is not None for s in self.slots)

  def submit(self, request: Request) -> None:
    """Queues a request (see `_assign` for the order)."""
    n = len(request.prompt)
    if n < 1 or request.max_new_tokens < 1:
      raise ValueError("a request needs >= 1 prompt token and max_new_tokens")
    if n + request.max_new_tokens > self.engine.cache_length:
      raise ValueError(
          f"a {n}-token prompt and {request.max_new_tokens} new tokens do not"
          f" fit cache_length={self.engine.cache_length}: truncate the prompt"
          " or build the engine with a longer cache"
      )
    self.queue.append(request)

  def run(
      self,
      requests: Sequence[Request] = (),
      on_result: Callable[[Result], None] | None = None,
      early: bool | None = None,
  ) -> list[Result]:
    """Serves until the queue is empty and no slot is live; `on_result`
    may `submit` more (an episode's next turn). Returns every result.
    `early` as for `step`; by default True with an `on_result` (it may
    queue the ended episode's next turn at once)."""
    for r in requests:
      self.submit(r)
    if early is None and on_result is not None:
      early = True
    done = []
    while self.queue or self.live:
      for res in self.step(early):
        done.append(res)
        if on_result is not None:
          on_result(res)
    return done

  def step(self, early: bool | None = None) -> list[Result]:
    """Fills free slots from the queue, then runs one `generate`; returns
    the requests that ended.

    Args:
      early: end the `generate` as soon as a row ends (so its slot is
        refilled at once) instead of after `decode_steps`; by default, when
        requests are waiting in the queue.
    """
    t0 = time.perf_counter()
    done = self._fill()
    if early is None:
      early = bool(self.queue)
    if self.live:
      done += self._generate(early)
    self.seconds += time.perf_counter() - t0
    return done

  # -------------------------------------------------------------- private

  def _free(self) -> list[int]:
    return [i for i, s in enumerate(self.slots) if s.request is None]

  def _continues(self, slot: _Slot, request: Request) -> bool:
    n = len(slot.history)
    return (
        self.engine.can_continue
        and slot.holder == request.key
        and len(request.prompt) > n
        and tuple(request.prompt[:n]) == slot.history
        # Dead writes since the row ended have not lapped its history.
        and self.clock - slot.first <= self.engine.cache_length
    )

  def _assign(self) -> list[tuple[Request, int]]:
    """Up to `prefill_rows` (request, slot) pairs from the queue.

    With `carry_first`, queued requests that can continue their own free
    slot go first (they cost no prefill of their history; an episode then
    plays its turns in one slot). The rest are served in order: a returning
    episode takes its own slot when it still holds it, any other request a
    free slot that holds nothing, else the one whose history has waited
    longest (evicting it).
    """
    free = set(self._free())
    k = self.engine.prefill_rows
    picked = []
    if self.carry_first:
      rest = collections.deque()
      for r in self.queue:
        s = self._held.get(r.key)
        if len(picked) < k and s in free and self._continues(self.slots[s], r):
          picked.append((r, s))
          free.discard(s)
        else:
          rest.append(r)
      self.queue = rest
    while free and self.queue and len(picked) < k:
      r = self.queue[0]
      s = self._held.get(r.key)
      if s not in free or not self._continues(self.slots[s], r):
        s = min(free, key=self._preference)
      self.queue.popleft()
      picked.append((r, s))
      free.discard(s)
    return picked

  def _preference(self, i: int) -> tuple[bool, int, int]:
    """Which free slot a request takes, least first: one that holds
    nothing (the shards' slots in turn, so `generate`'s gathered rows stay
    even across them), else the one whose history has waited longest."""
    slot, per = self.slots[i], self.engine.slots // self.engine.batch_shards
    if slot.holder is None:
      return (False, i % per, i // per)
    return (True, slot.freed_at, 0)

  def _shared(self, request: Request) -> tuple[int, int] | None:
    """(slot, tokens) of the longest prompt prefix another slot's cache
    still holds for `request` (at least a chunk, at most all but its last
    token), or None."""
    eng = self.engine
    if not (eng.share_prefixes and eng.can_continue):
      return None
    prompt, best = tuple(request.prompt), None
    for s, slot in enumerate(self.slots):
      if (
          len(slot.prefix) < eng.chunk
          or self.clock - slot.prefix_first > eng.cache_length
      ):
        continue
      n = min(len(slot.prefix), len(prompt) - 1)
      same = np.asarray(slot.prefix[:n]) == np.asarray(prompt[:n])
      p = n if same.all() else int(np.argmin(same))
      if p >= eng.chunk and (best is None or p > best[1]):
        best = (s, p)
    return best

  def _appends(self, slot: _Slot, request: Request) -> bool:
    """Whether a returning turn is fed through `generate` (`append_tokens`):
    it continues its slot, adds few enough tokens, and they and its reply
    fit before the clock laps its history."""
    eng = self.engine
    n = len(request.prompt) - len(slot.history)
    return (
        self._continues(slot, request)
        and n <= eng.append_tokens
        and self.clock - slot.first + n + request.max_new_tokens
        <= eng.cache_length
    )

  def _fill(self) -> list[Result]:
    done = []
    while True:
      picked = self._assign()
      if not picked:
        return done
      prefill = []
      for r, s in picked:
        slot = self.slots[s]
        if not self._appends(slot, r):
          prefill.append((r, s))
          continue
        n = len(slot.history)
        self._arming.append((s, r, list(r.prompt[n:])))
        self.requests_appended += 1
        self.requests_carried += 1
        self.tokens_carried += n
        self.tokens_appended += len(r.prompt) - n
        self.slots[s] = dataclasses.replace(
            slot, request=r, tokens=[], logprobs=[], carried=n,
            feeding=len(r.prompt) - n,
        )  # fmt: skip
      if prefill:
        done += self._prefill(prefill)

  def _prefill(self, picked: list[tuple[Request, int]]) -> list[Result]:
    eng = self.engine
    c, chunk, k = eng.cache_length, eng.chunk, eng.prefill_rows
    pad_to = lambda n: -(-n // chunk) * chunk
    # Per request: None (prefilled whole), ("own", slot) continuing its
    # slot's history, or ("shared", slot, tokens) copying another slot's
    # prefix; a source covers [first, first + span) of its row's times.
    sources = []
    for r, s in picked:
      if self._continues(self.slots[s], r):
        sources.append(("own", s, len(self.slots[s].history)))
      else:
        shared = self._shared(r)
        sources.append(None if shared is None else ("shared", *shared))

    def span(src):
      if src is None:
        return 0
      slot = self.slots[src[1]]
      return slot.end - slot.first if src[0] == "own" else src[2]

    while True:
      todo = [
          len(r.prompt) - (src[2] if src else 0)
          for (r, _), src in zip(picked, sources)
      ]
      width = pad_to(max(todo))
      # A continued history sits before the padded columns: it needs room
      # for them and the reply, else the request is prefilled whole.
      fits = [
          src is None or span(src) + width + r.max_new_tokens <= c
          for (r, _), src in zip(picked, sources)
      ]
      if all(fits):
        break
      sources = [src if ok else None for src, ok in zip(sources, fits)]
    hi = self.clock - width  # where the new columns begin
    rows = []
    for (r, s), src in zip(picked, sources):
      if src is None:
        rows.append((r.prompt, 0, False, 0, s, 0))
        continue
      kind, at, n = src
      held = self.slots[at]
      end = held.end if kind == "own" else held.prefix_first + n
      rows.append((r.prompt[n:], n, True, hi - end, at, span(src)))
      if kind == "own":
        self.requests_carried += 1
        self.tokens_carried += n
      else:
        self.requests_shared += 1
        self.tokens_shared += n
    m = len(picked)
    rows += [rows[0]] * (k - m)  # fillers, written nowhere
    tokens = np.full((k, c), eng.pad_id, np.int32)
    for i, row in enumerate(rows):
      tokens[i, c - len(row[0]) :] = row[0]
    column = lambda j, dtype: np.asarray([row[j] for row in rows], dtype)
    host_rows = (
        tokens,
        np.asarray([len(row[0]) for row in rows], np.int32),
        column(1, np.int32),
        column(2, bool),
        column(3, np.int32),
        np.int32((c - width) // chunk),
        column(4, np.int32),
        column(5, np.int32),
    )
    keys = np.zeros((k, 2), np.uint32)
    keys[:m] = [np.asarray(jax.random.key_data(r.rng)) for r, _ in picked]
    reqs = (
        np.asarray([s for _, s in picked] + [eng.slots] * (k - m), np.int32),
        keys,
        np.asarray(
            [r.max_new_tokens for r, _ in picked] + [1] * (k - m), np.int32
        ),
    )
    # The window holds each row's new columns and a continued row's
    # history before them.
    window = eng.window(width + max(span(src) for src in sources))
    _, _, prefill, _ = eng._programs
    t0 = time.perf_counter()
    self.state, out = eng._call(prefill, self.params, self.state, host_rows,
                                reqs, window)  # fmt: skip
    tok, logp, live, hit = jax.device_get(out)
    self.prefill_seconds += time.perf_counter() - t0
    self.prefill_calls += 1
    self.prefill_columns += k * width
    self.decode_row_steps += k  # the first tokens' draw
    done, before = [], list(self.slots)
    for i, ((r, s), src) in enumerate(zip(picked, sources)):
      slot = before[s]
      carried = src[2] if src else 0
      if src is None:
        first = self.clock - len(r.prompt)
        prefix, prefix_first = tuple(r.prompt), first
      elif src[0] == "own":
        first = hi - span(src)
        prefix = slot.prefix
        prefix_first = slot.prefix_first + (hi - slot.end)
      else:
        first = prefix_first = hi - carried
        # The rest of the prompt sits right after the prefix only when it
        # filled its columns (no left padding between them).
        rest = tuple(r.prompt[carried:])
        prefix = tuple(r.prompt[:carried]) + (
            rest if len(rest) == width else ()
        )
      if (src is None or src[0] == "shared") and slot.holder is not None:
        self._held.pop(slot.holder, None)
      self._held[r.key] = s
      self.slots[s] = _Slot(
          request=r, tokens=[int(tok[i])], logprobs=[float(logp[i])],
          carried=carried, holder=r.key, first=first, prefix=prefix,
          prefix_first=prefix_first,
      )  # fmt: skip
      self.tokens_generated += 1
      if not live[i]:
        done.append(self._end(s, bool(hit[i]), self.clock))
    return done

  def _generate(self, early: bool) -> list[Result]:
    eng = self.engine
    # The window holds every live row's history and at least a quarter of
    # a call's steps (the call stops when they are spent).
    held = max(self.clock - s.first for s in self.slots if s.request)
    window = eng.window(held + max(1, eng.decode_steps // 4))
    s_, f = eng.slots, max(eng.append_tokens, 1)
    arm = (np.zeros((s_,), bool), np.zeros((s_, f), np.int32),
           np.zeros((s_,), np.int32), np.zeros((s_, 2), np.uint32),
           np.ones((s_,), np.int32))  # fmt: skip
    for s, r, feed in self._arming:
      arm[0][s], arm[2][s], arm[4][s] = True, len(feed), r.max_new_tokens
      arm[1][s, : len(feed)] = feed
      arm[3][s] = np.asarray(jax.random.key_data(r.rng))
    self._arming = []
    rows, index = self._rows()
    _, _, _, generate = eng._programs
    self.state, out = eng._call(generate, self.params, self.state,
                                np.bool_(early), np.int32(window - held), arm,
                                window, index)  # fmt: skip
    toks, lps, emitted, live, hit, steps = jax.device_get(out)
    steps = int(steps)
    self.generate_calls += 1
    self.window_row_steps += rows * steps * window
    self.windows[window] += 1
    self.rows[rows] += 1
    before = self.clock
    self.clock += steps
    # An appended turn's fed tokens are its prompt (as a prefill's columns
    # are), not decode padding.
    feeding = sum(
        min(max(slot.feeding - 1, 0), steps)
        for slot in self.slots
        if slot.request is not None
    )
    self.decode_row_steps += rows * steps - feeding
    done = []
    for s, slot in enumerate(self.slots):
      if slot.request is None:
        continue
      e = int(emitted[s])
      # Its tokens start at the step that fed its last appended token.
      off = max(slot.feeding - 1, 0)
      slot.tokens += toks[s, off : off + e].tolist()
      slot.logprobs += lps[s, off : off + e].tolist()
      fed = off + e  # one token a step, at times before, before + 1, ...
      slot.feeding = max(slot.feeding - steps, 0)
      self.tokens_generated += e
      if not live[s]:
        done.append(self._end(s, bool(hit[s]), before + fed))
    return done

  def _rows(self) -> tuple[int, np.ndarray | None]:
    """The rows the next `generate` runs on (the smallest of
    `Engine.rows` holding each shard's live slots) and their slots'
    indices within their shards (None: every slot)."""
    eng = self.engine
    sh = eng.batch_shards
    per = eng.slots // sh
    live = [s for s, slot in enumerate(self.slots) if slot.request is not None]
    need = max(collections.Counter(s // per for s in live).values())
    rows = next(r for r in eng.rows if r // sh >= need)
    if rows == eng.slots:
      return rows, None
    b, index = rows // sh, np.zeros((sh, rows // sh), np.int32)
    for k in range(sh):
      mine = [s - k * per for s in live if s // per == k]
      taken = set(mine)
      index[k] = (mine + [i for i in range(per) if i not in taken])[:b]
    return rows, index

  def _end(self, s: int, hit: bool, end: int) -> Result:
    """Frees slot s; it keeps its history (the prompt and every sampled
    token but the last, the ones fed; `end` is one past the last one's
    cache time) for the episode's next turn."""
    slot = self.slots[s]
    r = slot.request
    slot.history = tuple(r.prompt) + tuple(slot.tokens[:-1])
    slot.end = end
    slot.request = None
    self._frees += 1
    slot.freed_at = self._frees
    return Result(
        request=r,
        tokens=np.asarray(slot.tokens, np.int32),
        logprobs=np.asarray(slot.logprobs, np.float32),
        finished=hit,
        slot=s,
        carried=slot.carried,
    )
