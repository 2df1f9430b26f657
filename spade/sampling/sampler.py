"""Compiled batched sampling: jitted prefill + `lax.while_loop` decode.

Model-agnostic (STYLE.md rule 7): the `Sampler` takes two callables, not a
model class,

  tokens_to_logits(params, tokens[B, L], positions[B, L], input_mask[B, L],
                   cache, cache_index) -> (float32 logits[B, V] of the LAST
                   position, new cache)
  init_cache(batch, length) -> cache pytree

(`spade.model.transformer.sampling_fns(config.model, role)` builds them, with
a third, `prepare_params`, run once per call: `Sampler(*fns, pad_id=...)`).

Layout: prompts are LEFT-padded to a common length L (the row's prompt sits at
the right end, `input_mask` False on the padding). Every row then writes its
next token at the same cache slot, so the cache index is one scalar and one
compiled step serves the whole batch; each row's positions start at 0 at its
first real token.

Outputs, per row: `tokens[B, max_new_tokens]` (pad after the end),
`logprobs[B, max_new_tokens]` = log_softmax(raw logits)[sampled token], i.e.
under the model's own distribution BEFORE temperature, top-k and top-p (what
policy-gradient ratios need; 0 after the end), `lengths[B]` = tokens generated
INCLUDING a stop token, and `finished[B]` = the row hit one of `stop_ids`.

Sampling: temperature 0 is greedy (argmax). Otherwise the logits are divided by
the temperature, restricted to the top-k (k > 0) and/or the nucleus (top_p <
1), and sampled by inverse CDF in two stages (blocks of the vocabulary, then
within the chosen block): exact, and much cheaper on CPU than Gumbel noise for
a 262k vocabulary. top_p < 1 without top_k finds the nucleus's threshold by
bisection, not by sorting the vocabulary (`_nucleus_threshold`: 2.0 against
47.9 ms a row of 151,936 logits on this CPU), and the top-k without sorting
it either (`exact_top_k`: block maxima, then the k best blocks). Where a
decode step's logits are split over the vocabulary across chips (the slot
engine on a mesh), `sample_split` draws the same tokens from each chip's
part, moving only the candidates.

Sharing: a prefix common to every row is prefilled once (`share_prefix`)
and identical prompts are prefilled once each (`share_rows`); the copies
take the cache of the row that was prefilled, so the samples are those of a
row-by-row prefill.

Continuing: `keep_cache=True` returns the final cache and the slots of each
row's tokens; a later call given a `Carry` of it gathers each row's slots
into the front of its new cache and prefills only the tokens after them,
at positions that continue them (the next turn of an episode: the reply's
last token and the environment's answer). Models with ring buffers cannot.

Compilation: one jit per Sampler; it specialises on (batch, prompt length,
max_new_tokens, greedy, top_k, whether top_p < 1, the shared prefix's length,
the distinct rows' power-of-two bucket, the carried slots' width and
`keep_cache`); temperature and top_p are traced, so changing them does not
recompile. The KV cache is created inside the compiled function and carried
by the loop, so it is updated in place.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from spade import console
from spade.model import sharding
from spade.sampling import shapes

Array = jax.Array

# Vocabulary block size of the two-stage inverse-CDF draw.
_BLOCK = 512
# A length past any sliding window: a ring buffer's size stops following it.
_LONG = 1 << 20


@dataclasses.dataclass(frozen=True)
class SampleOutput:
  """What `Sampler.__call__` returns: host numpy arrays of the WHOLE batch.

  Under a mesh the outputs are replicated, so on every process of a
  multi-host run these hold all rows (no further all-gather is needed).
  """

  tokens: np.ndarray  # int32[B, max_new_tokens]
  logprobs: np.ndarray  # float32[B, max_new_tokens]
  lengths: np.ndarray  # int32[B]
  finished: np.ndarray  # bool[B]
  # Prompt tokens common to every row that were prefilled once for the batch
  # (a row per batch shard of the mesh; 0 when none was shared).
  shared_prefix: int = 0
  # Rows whose prompts (after the shared prefix) were prefilled: identical
  # prompts are prefilled once, and the copies take that row's cache.
  prefilled_rows: int = 0
  # Prompt columns each prefilled row wrote (padding included).
  prefill_length: int = 0
  # Prompt tokens (padding included) a row-by-row prefill would have
  # written that the sharing did not.
  prefill_tokens_saved: int = 0
  # With `keep_cache`: the final KV cache (on device) and, per row, the
  # slots holding the row's prompt and every sampled token but the last, in
  # order (what a later call continues from, see `Carry`).
  cache: Any = None
  slots: tuple[np.ndarray, ...] | None = None


@dataclasses.dataclass(frozen=True)
class Carry:
  """Rows of an earlier call's KV cache that this call's rows continue.

  Row r of the call starts from row `rows[r]` of `cache` (-1: from nothing),
  whose tokens sit at slots `slots[r]` in order (-1 pads the end); its prompt
  then holds only the tokens after those, and its positions continue from
  their count. Nothing is prefilled again, and a row's samples are those a
  prefill of its whole history would give (up to float rounding).
  """

  cache: Any  # `SampleOutput.cache` of the earlier call
  rows: np.ndarray  # int32[B]
  slots: np.ndarray  # int32[B, C]


def left_pad(
    rows: Sequence[Sequence[int]], length: int, pad_id: int
) -> tuple[np.ndarray, np.ndarray]:
  """Left-pads token lists to `length`; returns (int32[B, L], lengths[B]).

  Raises:
    ValueError: a row is longer than `length` or empty.
  """
  out = np.full((len(rows), length), pad_id, np.int32)
  lengths = np.zeros(len(rows), np.int32)
  for i, row in enumerate(rows):
    if not row:
      raise ValueError(f"prompt {i} is empty; give at least one token (bos)")
    if len(row) > length:
      raise ValueError(
          f"prompt {i} has {len(row)} tokens > {length}; truncate it first"
      )
    out[i, length - len(row) :] = row
    lengths[i] = len(row)
  return out, lengths


def row_axes(init_cache, length: int):
  """Per cache leaf: (the axis holding the rows, entries per row), or None.

  Model-agnostic: the axis is the one that grows from a batch of one to a
  batch of two (one entry per row in `kv_cache`'s layout; a cache that
  merged rows with heads, `[B * kv_heads, ...]`, would hold each row's heads
  together, `kv_heads` entries per row).
  """
  one = jax.eval_shape(lambda: init_cache(1, length))
  two = jax.eval_shape(lambda: init_cache(2, length))

  def axis(a, b):
    grew = _grown_axis(a, b)
    return None if grew is None else (grew, a.shape[grew])

  return jax.tree.map(axis, one, two)


def _grown_axis(a, b) -> int | None:
  """The first axis where shapes a and b differ, or None."""
  grew = [i for i, (x, y) in enumerate(zip(a.shape, b.shape)) if x != y]
  return grew[0] if grew else None


def _take_rows(cache, rows: Array, axes):
  """The cache of rows `rows` (int32[N]) of `cache`: row i is rows[i]'s."""

  def take(x, spec):
    if spec is None:
      return x
    axis, per_row = spec
    shape = x.shape
    split = shape[:axis] + (shape[axis] // per_row, per_row) + shape[axis + 1 :]
    y = jnp.take(x.reshape(split), rows, axis=axis)
    return y.reshape(
        shape[:axis] + (rows.shape[0] * per_row,) + shape[axis + 1 :]
    )

  return jax.tree.map(take, cache, axes)


def slot_axes(init_cache, length: int):
  """Per cache leaf: the axis holding the time slots, or None (a leaf
  whose size does not follow the length, e.g. a sliding window's ring)."""
  one = jax.eval_shape(lambda: init_cache(1, length))
  two = jax.eval_shape(lambda: init_cache(1, length + 1))
  return jax.tree.map(_grown_axis, one, two)


def _carried(old, new, rows: Array, slots: Array, row_specs, slot_specs):
  """`new` with slots [0, C) of each row r holding row rows[r]'s entries at
  slots[r] of `old` (slots -1: empty, position -1, never attended)."""
  c = slots.shape[1]
  valid = slots >= 0
  safe_rows = jnp.maximum(rows, 0)
  safe_slots = jnp.maximum(slots, 0)

  def put(x_old, x_new, spec, t):
    axis, per_row = spec
    shape = x_old.shape
    y = x_old.reshape(shape[:axis] + (shape[axis] // per_row, per_row)
                      + shape[axis + 1 :])  # fmt: skip
    y = jnp.take(y, safe_rows, axis=axis)
    t = t + 1  # the rows' axis was split in two before it
    # The slot index of each (row, slot), broadcast over the other axes.
    idx_shape = [1] * y.ndim
    idx_shape[axis], idx_shape[t] = rows.shape[0], c
    idx = safe_slots.reshape(idx_shape)
    y = jnp.take_along_axis(y, jnp.broadcast_to(
        idx, y.shape[:t] + (c,) + y.shape[t + 1 :]), axis=t)  # fmt: skip
    if jnp.issubdtype(y.dtype, jnp.integer):  # positions: -1 where empty
      y = jnp.where(valid.reshape(idx_shape), y, -1)
    y = y.reshape(shape[:axis] + (rows.shape[0] * per_row,)
                  + y.shape[axis + 2 :])  # fmt: skip
    return jax.lax.dynamic_update_slice_in_dim(
        x_new, y.astype(x_new.dtype), 0, axis=t - 1
    )

  return jax.tree.map(put, old, new, row_specs, slot_specs)


def _report(generated, live, rows) -> None:
  """The decode loop's progress callback (`Sampler.report_every`)."""
  ticker = console.current_ticker()
  if ticker is not None:
    ticker.update(int(generated), live=int(live), rows=int(rows))


def bucket(n: int, minimum: int = 8) -> int:
  """The smallest power of two >= max(n, minimum): bounds recompiles."""
  return shapes.bucket(n, minimum=minimum)


def _categorical(key: Array, logits: Array, most: Array | None = None) -> Array:
  """Exact categorical draw from float32 logits[B, V] (-inf allowed);
  `most`, when the caller has it, is their max per row ([B, 1])."""
  b, v = logits.shape
  nb = -(-v // _BLOCK)
  if most is None:
    most = jnp.max(logits, -1, keepdims=True)
  probs = jnp.exp(logits - most)
  probs = jnp.pad(probs, ((0, 0), (0, nb * _BLOCK - v)))
  blocks = probs.reshape(b, nb, _BLOCK)
  u = jax.random.uniform(key, (2, b, 1))

  def pick(weights, u):
    cdf = jnp.cumsum(weights, -1)
    # First index whose cdf exceeds u * total: never a zero-weight entry.
    idx = jnp.sum(cdf <= u * cdf[:, -1:], -1)
    return jnp.minimum(idx, weights.shape[-1] - 1)

  block = pick(jnp.sum(blocks, -1), u[0])
  within = jnp.take_along_axis(blocks, block[:, None, None], 1)[:, 0]
  return (block * _BLOCK + pick(within, u[1])).astype(jnp.int32)


def exact_top_k(x: Array, k: int, block: int = 128) -> tuple[Array, Array]:
  """`jax.lax.top_k(x, k)` over the last axis, the same values and indices
  (ties to the lower index), without sorting the whole row: XLA's TPU
  top-k sorts every word of a decode step's [rows, 262,144] float32 logits,
  writes the sorted values and indices whole and, at 128 rows or more a
  chip, copies them twice over to and from a layout with the rows minor.

  The row's blocks of `block` words each give their max; the k blocks with
  the largest (ties to the lower block) hold every one of the row's top k
  (an element of the top k is at least the k-th largest block max, so its
  block's max is too; where maxima tie at that value, the lower blocks are
  taken and hold enough of the tied elements before any later one). Those
  blocks, in their order in the row, give the k. So the row is read once,
  for the maxima, and only k blocks again. With the rows in eights the
  maxima are taken in the order of TPU's (8, 128) tiles, so they fuse into
  the logits' producer; a window reduction made TPU copy the logits into a
  layout with the rows minor first."""
  *lead, v = x.shape
  n = -(-v // block)
  if n <= k:
    return jax.lax.top_k(x, k)
  # Padding ties the row's lowest value at most, and loses the tie.
  floating = jnp.issubdtype(x.dtype, jnp.floating)
  low = jnp.asarray(-jnp.inf if floating else jnp.iinfo(x.dtype).min, x.dtype)
  if v % block:  # a copy of the row, for a vocabulary off the block
    x = jnp.pad(
        x, [(0, 0)] * len(lead) + [(0, n * block - v)], constant_values=low
    )
  # A plain reshape into [rows, blocks, 128] crosses TPU's (8, 128) tiles
  # of the rows and copies them.
  r = int(np.prod(lead))
  if r % 8 == 0:
    # Rows in eights and words in blocks: the order of TPU's (8, 128) tiles.
    tiles = x.reshape(r // 8, 8, n, block).transpose(0, 2, 1, 3)
    maxima = jnp.max(tiles, -1).transpose(0, 2, 1).reshape(*lead, n)
  else:
    window = (1,) * len(lead) + (block,)
    maxima = jax.lax.reduce_window(x, low, jax.lax.max, window, window, "VALID")
  _, chosen = jax.lax.top_k(maxima, k)
  rows = x.reshape(-1, n * block)
  starts = jnp.sort(chosen, -1).reshape(-1, k) * block  # the row's order
  take = lambda row, s: jax.lax.dynamic_slice_in_dim(row, s, block)
  words = jax.vmap(jax.vmap(take, (None, 0)))(rows, starts)
  vals, at = jax.lax.top_k(words.reshape(-1, k * block), k)
  idx = jnp.take_along_axis(starts, at // block, -1) + at % block
  return vals.reshape(*lead, k), idx.reshape(*lead, k).astype(jnp.int32)


def _nucleus(sorted_desc: Array, top_p: Array) -> Array:
  """Mask over descending-sorted logits keeping the smallest set >= top_p."""
  probs = jax.nn.softmax(sorted_desc, -1)
  before = jnp.cumsum(probs, -1) - probs
  return before < top_p


def _ordered(x: Array) -> Array:
  """float32 -> int32 keys in the same order (-0.0 just below +0.0)."""
  i = jax.lax.bitcast_convert_type(x, jnp.int32)
  return i ^ ((i >> 31) & jnp.int32(0x7FFFFFFF))


def _unordered(k: Array) -> Array:
  """The inverse of `_ordered`."""
  return jax.lax.bitcast_convert_type(
      k ^ ((k >> 31) & jnp.int32(0x7FFFFFFF)), jnp.float32
  )


def nucleus_threshold_sorted(scaled: Array, top_p: Array) -> Array:
  """The nucleus's smallest kept logit per row, by sorting the vocabulary:
  [B, 1]. `_nucleus_threshold` finds the same value without the sort; this
  is its definition (and its test's oracle)."""
  desc = -jnp.sort(-scaled, -1)
  keep = _nucleus(desc, top_p)
  return jnp.min(jnp.where(keep, desc, jnp.inf), -1, keepdims=True)


def _nucleus_threshold(scaled: Array, top_p: Array) -> Array:
  """The smallest logit the nucleus keeps, per row ([B, 1]); the nucleus is
  every logit >= it (ties at the threshold all kept).

  In descending order the nucleus keeps logit i while the mass before it is
  below `top_p`, so its smallest kept value is the smallest logit v whose
  mass strictly above v, G(v), is below `top_p`: G falls as v rises. That v
  is found by bisection over the float32 values' order (32 halvings of the
  int32 keys, each a masked sum over the vocabulary) instead of sorting it:
  ~2 ms a row against ~45 ms for 151,936 logits on a CPU core. It equals
  `nucleus_threshold_sorted` up to the order the masses are summed in (a
  mass within float rounding of `top_p` may fall either side).
  """
  probs = jax.nn.softmax(scaled, -1)
  lo = _ordered(jnp.min(scaled, -1))  # G(lo) = 1 - its own mass
  hi = _ordered(jnp.max(scaled, -1))  # G(hi) = 0 < top_p

  def above(k):
    v = _unordered(k)[:, None]
    return jnp.sum(jnp.where(scaled > v, probs, 0.0), -1)

  def halve(_, bounds):
    # Invariant: G(lo) >= top_p > G(hi); 32 halvings leave hi = lo + 1.
    lo, hi = bounds
    mid = (lo >> 1) + (hi >> 1) + (lo & hi & 1)  # hi - lo may pass 2^31
    fits = above(mid) < top_p
    return jnp.where(fits, lo, mid), jnp.where(fits, mid, hi)

  # Below the smallest logit every mass is above: G = 1 >= top_p.
  lo = jnp.where(above(lo) < top_p, lo - 1, lo)
  _, hi = jax.lax.fori_loop(0, 32, halve, (lo, hi))
  # G(hi) < top_p <= G(hi - 1): G falls at hi, so hi is a logit's key; the
  # smallest logit >= it is that logit also where the CPU flushes a
  # denormal hi (between -0.0 and a tiny negative logit) to zero.
  v = _unordered(hi)[:, None]
  return jnp.min(jnp.where(scaled >= v, scaled, jnp.inf), -1, keepdims=True)


def prefill_chunks(
    tokens_to_logits: Callable[..., tuple[Array, Any]],
    params,
    tokens: Array,
    positions: Array,
    mask: Array,
    cache,
    offset,
    *,
    chunk: int,
    stop: int,
    first=0,
    start: int = 0,
    logits: Array | None = None,
) -> tuple[Array, Any]:
  """Feeds chunks `first` to `stop` of the columns into the cache, in a loop.

  Chunk i is the columns [start + i * chunk, start + (i + 1) * chunk) of
  `tokens`, `positions` and `mask` ([rows, columns] each), column j written
  at cache time `offset + j`. The loop carries the cache, so the program
  does not grow with the prompt. Returns the last chunk's logits and the
  cache; `logits` is the loop's first carry (zeros of the logits' type when
  None, for a loop that runs at least once). Both the lock-step sampler
  (`Sampler.prefill`) and the slot engine's prefill-insert prefill through
  it.
  """

  def one(i, carry):
    _, cache = carry
    at = start + i * chunk if start else i * chunk

    def cols(x):
      return jax.lax.dynamic_slice_in_dim(x, at, chunk, axis=1)

    return tokens_to_logits(
        params, cols(tokens), cols(positions), cols(mask), cache, offset + at
    )

  if logits is None:  # the loop's carry needs the logits' type
    logits = jax.eval_shape(
        lambda c: tokens_to_logits(
            params, tokens[:, :chunk], positions[:, :chunk], mask[:, :chunk],
            c, jnp.asarray(offset, jnp.int32),
        )[0],
        cache,
    )  # fmt: skip
    logits = jnp.zeros(logits.shape, logits.dtype)
  return jax.lax.fori_loop(first, stop, one, (logits, cache))


def _first_max(logits: Array) -> tuple[Array, Array]:
  """Each row's max and the first index holding it ([B, 1] each): argmax's
  answer from two plain reductions (XLA's CPU argmax, one (value, index)
  reduce, took 5.8 ms a decode step for 8 x 262,144 logits, these 1.7). A
  row with no max (NaN) gets the last index."""
  v = logits.shape[-1]
  iota = jax.lax.broadcasted_iota(jnp.int32, logits.shape, 1)
  most = jnp.max(logits, -1, keepdims=True)
  first = jnp.min(jnp.where(logits == most, iota, v - 1), -1, keepdims=True)
  return most, first


def sample_logits(
    key: Array,
    logits: Array,
    *,
    greedy: bool,
    top_k: int,
    use_top_p: bool,
    temperature: Array,
    top_p: Array,
) -> tuple[Array, Array]:
  """Draws one token per row; returns (int32[B], log_softmax(logits)[tok])."""
  logits = logits.astype(jnp.float32)
  if greedy:
    most, first = _first_max(logits)
    return first[:, 0], _log_softmax_at(logits, most[:, 0], most)
  if top_k > 0:
    vals, idx = exact_top_k(logits, top_k)
    tok, chosen = _draw_top_k(key, vals, idx, temperature, use_top_p, top_p)
    return tok, _log_softmax_at(logits, chosen, vals[:, :1])
  most = jnp.max(logits, -1, keepdims=True)
  scaled = logits / temperature
  if use_top_p:  # the max is always kept
    threshold = _nucleus_threshold(scaled, top_p)
    scaled = jnp.where(scaled >= threshold, scaled, -jnp.inf)
  # Division by a positive float keeps order, rounding included: the scaled
  # max is the max scaled.
  tok = _categorical(key, scaled, most / temperature)
  chosen = jnp.take_along_axis(logits, tok[:, None], 1)[:, 0]
  return tok, _log_softmax_at(logits, chosen, most)


def _log_softmax_at(
    logits: Array, chosen: Array, most: Array, axes=None
) -> Array:
  """log_softmax(logits)[tok] from the chosen logits ([B]) and the rows'
  max ([B, 1]): jax.nn.logsumexp's floats, step for step, without its own
  pass for the max when the sampler already has it (greedy's max, top-k's
  first value), and with no gather over the vocabulary for the chosen
  logit where top-k's values hold it. Each pass over a decode step's
  [rows, 262,144] float32 logits is a read from HBM on TPU. With `axes`
  (`sample_split`), `logits` is one shard of the vocabulary and the sum
  is added up across them."""
  shift = jax.lax.stop_gradient(jnp.where(jnp.isfinite(most), most, 0.0))
  total = jnp.sum(jnp.exp(logits - shift), -1)
  if axes is not None:
    total = jax.lax.psum(total, axes)
  return chosen - (jnp.log(jnp.abs(total)) + shift[:, 0])


def sample_split(
    keys: Array,
    logits: Array,
    *,
    axes: str | tuple[str, ...],
    greedy: bool,
    top_k: int,
    use_top_p: bool,
    temperature: Array,
    top_p: Array,
) -> tuple[Array, Array]:
  """Each row's `sample_logits` of batch one, on its own key (`keys` [B]),
  over a vocabulary split across the mesh axes `axes`: called inside
  `jax.shard_map` (manual over them), `logits` [B, V / n] is this shard's
  part, the shards in the order of `axes`. Each shard takes its own
  candidates (its max, or its top k) and only those cross the mesh, so
  no chip reads or receives another's logits; the log-softmax's sum is
  added up across the shards. The same tokens as on the whole rows (the
  candidates are exact, and ties go to the lower index, as
  `jax.lax.top_k` and greedy's argmax give them), the log-probabilities
  up to the order the shards' sums are added in. Needs greedy or
  0 < top_k <= V / n."""
  if not greedy and not 0 < top_k <= logits.shape[-1]:
    raise ValueError(
        f"sample_split draws greedy or from a top-k of at most a shard's"
        f" {logits.shape[-1]} words, not top_k={top_k}: use sample_logits"
        " on whole rows"
    )
  logits = logits.astype(jnp.float32)
  v = logits.shape[-1]
  offset = jax.lax.axis_index(axes) * v

  def across(x):  # [B, m] a shard -> [B, n * m], in the shards' order
    return jax.lax.all_gather(x, axes, axis=1, tiled=True)

  if greedy:
    most, first = _first_max(logits)
    tops, firsts = across(most), across(first + offset)
    top = jnp.max(tops, -1, keepdims=True)
    big = jnp.iinfo(jnp.int32).max
    tok = jnp.min(jnp.where(tops == top, firsts, big), -1)
    return tok, _log_softmax_at(logits, top[:, 0], top, axes)
  vals, idx = exact_top_k(logits, top_k)
  vals, idx = across(vals), across(idx + offset)
  vals, pos = jax.lax.top_k(vals, top_k)
  idx = jnp.take_along_axis(idx, pos, 1)

  def one(key, vals, idx):  # a row's draw, as a batch of one
    tok, chosen = _draw_top_k(
        key, vals[None], idx[None], temperature, use_top_p, top_p
    )
    return tok[0], chosen[0]

  tok, chosen = jax.vmap(one)(keys, vals, idx)
  return tok, _log_softmax_at(logits, chosen, vals[:, :1], axes)


def _draw_top_k(key, vals, idx, temperature, use_top_p, top_p):
  """(token, its logit) drawn from the top-k values [B, k] (descending)
  and their word ids: top-k's values are the logits' own floats."""
  scaled = vals / temperature
  if use_top_p:
    scaled = jnp.where(_nucleus(scaled, top_p), scaled, -jnp.inf)
  choice = _categorical(key, scaled)[:, None]
  tok = jnp.take_along_axis(idx, choice, 1)[:, 0].astype(jnp.int32)
  return tok, jnp.take_along_axis(vals, choice, 1)[:, 0]


@dataclasses.dataclass(frozen=True)
class Sampler:
  """Batched sampler over a `tokens_to_logits` callable (see module doc).

  Attributes:
    tokens_to_logits: the model step (see module docstring).
    init_cache: (batch, length) -> empty cache.
    prepare_params: params -> the parameters `tokens_to_logits` takes, run
      once per call inside the compiled function (e.g. a decoding layout);
      None passes them as given.
    share_prefix: when every row's prompt starts with the same tokens, the
      longest such prefix rounded down to a multiple of this (0 = never) is
      prefilled once at batch 1 and its cache copied to every row; only the
      rows' own suffixes are prefilled per row (a batch of one prompt's
      samples, or prompts with a common head). The suffixes are left-padded
      after the prefix, so the cache must keep every written slot (no ring
      buffers); `sampling_fns` sets it only for such models.
    share_rows: rows whose prompts are identical (the K episodes of one
      environment's arm on their first turn) are prefilled once and the
      copies take that row's cache; the prefill runs on the distinct rows
      (padded to a power of two and the mesh's batch multiple) when that is
      fewer than the batch. Exact for every model: a copy's cache is what
      its own prefill would write.
    pad_id: written after a row ends.
    stop_ids: a row ends after emitting one of these (it is kept in tokens).
    mesh: optional mesh; with it, inputs are batch-sharded and the model's
      logical constraints are active (params should come from
      `spade.model.sharding.shard_params`).
    rules: the logical axis rules used with `mesh` (`config.mesh.rules`;
      needed with a mesh).
    prefill_chunk: prompt columns written per prefill step (0 = all at
      once): memory for attention scores grows with it, not with the prompt
      (32 designer prompts of 2,688 tokens at once asked for 30 GB).
    report_every: every this many decode steps, the loop sends (tokens so
      far, live rows, rows) to the host's `spade.console.current_ticker()`
      (a live progress line inside a long call); 0 compiles no callback.
  """

  tokens_to_logits: Callable[..., tuple[Array, Any]]
  init_cache: Callable[[int, int], Any]
  prepare_params: Callable[[Any], Any] | None = None
  share_prefix: int = 0
  _: dataclasses.KW_ONLY
  pad_id: int
  share_rows: bool = True
  stop_ids: tuple[int, ...] = ()
  mesh: Any = None
  rules: tuple[Any, ...] = ()
  prefill_chunk: int = 512
  report_every: int = 0

  def __post_init__(self):
    if self.mesh is not None and not self.rules:
      raise ValueError(
          "a mesh needs its logical axis rules: pass rules=config.mesh.rules"
      )

  @functools.cached_property
  def _compiled(self):
    return jax.jit(
        self._generate,
        static_argnames=(
            "max_new_tokens", "greedy", "top_k", "use_top_p", "keep_cache"
        ),
    )  # fmt: skip

  @property
  def _batch_shards(self) -> int:
    """Rows come in multiples of this (the mesh's data x fsdp)."""
    if self.mesh is None:
      return 1
    return self.mesh.shape["data"] * self.mesh.shape["fsdp"]

  @functools.cached_property
  def can_continue(self) -> bool:
    """Whether a call can start from a `Carry`: every cache leaf has a slot
    axis that follows the length (no sliding window's ring buffer)."""
    axes = jax.tree.leaves(
        slot_axes(self.init_cache, _LONG), is_leaf=lambda x: x is None
    )
    return all(a is not None for a in axes)

  def __call__(
      self,
      params: Any,
      prompts: np.ndarray | Sequence[Sequence[int]],
      prompt_lengths: np.ndarray | None = None,
      *,
      max_new_tokens: int,
      rng: Array,
      temperature: float = 1.0,
      top_k: int = 0,
      top_p: float = 1.0,
      row_max_new_tokens: np.ndarray | None = None,
      carry: Carry | None = None,
      keep_cache: bool = False,
  ) -> SampleOutput:
    """Samples continuations of left-padded prompts.

    Args:
      params: the model parameters given to `tokens_to_logits`.
      prompts: int32[B, L], left-padded (see `left_pad`); or a list of token
        lists, then left-padded here to a power-of-two length (>= 8) so that
        few shapes compile.
      prompt_lengths: int32[B], real tokens per row (>= 1); omit with lists.
      max_new_tokens: the most tokens any row generates (static).
      rng: a PRNG key; the same key gives the same samples.
      temperature: 0 for greedy.
      top_k: keep the k most likely tokens (0 = all).
      top_p: nucleus mass (1.0 = all).
      row_max_new_tokens: optional int32[B] per-row limits (<= max_new_tokens).
      carry: rows of an earlier call's cache the rows continue (`Carry`);
        `prompts` then hold only the tokens after the carried ones. No prefix
        or row sharing in such a call (the rows' caches differ).
      keep_cache: return the final cache and each row's slots in the output,
        for a later call's `Carry`.

    Returns:
      A `SampleOutput` (see module docstring).
    """
    if prompt_lengths is None:
      longest = max((len(p) for p in prompts), default=1)
      prompts, prompt_lengths = left_pad(prompts, bucket(longest), self.pad_id)
    prompts = np.asarray(prompts, np.int32)
    prompt_lengths = np.asarray(prompt_lengths, np.int32)
    b, length = prompts.shape
    if prompt_lengths.shape != (b,):
      raise ValueError(
          f"prompt_lengths has shape {prompt_lengths.shape}, expected ({b},)"
      )
    if np.any(prompt_lengths < 1) or np.any(prompt_lengths > length):
      raise ValueError(f"prompt_lengths must be in [1, {length}]")
    if max_new_tokens < 1:
      raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")
    if temperature < 0 or not 0 < top_p <= 1 or top_k < 0:
      raise ValueError(
          f"need temperature >= 0, 0 < top_p <= 1, top_k >= 0; got "
          f"{temperature}, {top_p}, {top_k}"
      )
    if row_max_new_tokens is None:
      limits = np.full((b,), max_new_tokens, np.int32)
    else:
      limits = np.minimum(np.asarray(row_max_new_tokens, np.int32),
                          max_new_tokens)  # fmt: skip
      if limits.shape != (b,):
        raise ValueError(f"row_max_new_tokens must have shape ({b},)")
    greedy = temperature == 0
    shards = self._batch_shards
    base = np.zeros((b,), np.int32)  # tokens before each row's prompt
    carried = None
    if carry is not None:
      if not self.can_continue:
        raise ValueError(
            "this model's cache keeps ring buffers (sliding windows), so a"
            " call cannot continue an earlier one: sample without `carry`"
        )
      from_rows = np.asarray(carry.rows, np.int32)
      from_slots = np.asarray(carry.slots, np.int32)
      if from_rows.shape != (b,) or from_slots.shape[:1] != (b,):
        raise ValueError(
            f"carry.rows {from_rows.shape} and carry.slots"
            f" {from_slots.shape} must have {b} rows"
        )
      from_slots = np.where(from_rows[:, None] >= 0, from_slots, -1)
      base = np.sum(from_slots >= 0, axis=1).astype(np.int32)
      carried = (carry.cache, from_rows, from_slots)
      prefix, unique, inverse = None, None, None
    else:
      prefix, prompts, prompt_lengths = self._split_prefix(
          prompts, prompt_lengths, shards
      )
      unique, inverse = self._unique_rows(prompts, prompt_lengths, shards)
      if prefix is not None:
        base[:] = prefix.shape[1]
    args = (
        params,
        prefix,
        unique,
        inverse,
        carried,
        prompts,
        prompt_lengths,
        base,
        limits,
        rng,
        jnp.float32(temperature if not greedy else 1.0),
        jnp.float32(top_p),
    )
    static = dict(
        max_new_tokens=int(max_new_tokens),
        greedy=bool(greedy),
        top_k=int(top_k) if not greedy else 0,
        use_top_p=bool(top_p < 1.0) and not greedy,
        keep_cache=bool(keep_cache),
    )
    if self.mesh is None:
      out = self._compiled(*args, **static)
    else:
      rules = self.rules
      rows = sharding.logical_sharding(self.mesh, rules, "batch")
      grid = sharding.batch_sharding(self.mesh, rules, 2)
      if b % shards:
        raise ValueError(
            f"batch {b} is not a multiple of the mesh's batch shards "
            f"(data*fsdp = {shards}); pad the batch with filler prompts"
        )
      # Every process holds the same global host arrays (multi-host SPMD);
      # each places only its addressable shards.
      args = args[:5] + tuple(
          jax.make_array_from_callback(a.shape, s, lambda i, a=a: a[i])
          for a, s in zip(args[5:9], (grid, rows, rows, rows))
      ) + args[9:]  # fmt: skip
      with sharding.use_rules(self.mesh, rules):
        out = self._compiled(*args, **static)
    cache = None
    if keep_cache:
      *out, cache = out
    tokens, logprobs, lengths, finished = jax.device_get(tuple(out))
    n_rows = b if unique is None else len(unique)
    slots = None
    if keep_cache:
      # The columns before the prompts: the shared prefix or carried slots.
      head = 0 if prefix is None else prefix.shape[1]
      if carried is not None:
        head = carried[2].shape[1]
      slots = self._row_slots(
          head, prompts.shape[1], base, prompt_lengths, lengths
      )
    return SampleOutput(
        tokens=np.asarray(tokens),
        logprobs=np.asarray(logprobs),
        lengths=np.asarray(lengths),
        finished=np.asarray(finished),
        shared_prefix=0 if prefix is None else prefix.shape[1],
        prefilled_rows=n_rows,
        prefill_length=prompts.shape[1],
        prefill_tokens_saved=(b - n_rows) * prompts.shape[1]
        + (0 if prefix is None else (b - prefix.shape[0]) * prefix.shape[1]),
        cache=cache,
        slots=slots,
    )

  @staticmethod
  def _row_slots(head, length, base, prompt_lengths, lengths):
    """Per row, the cache slots of its tokens in order: its `base` tokens
    (the shared prefix, or the carried ones, gathered to the front), its
    prompt (left-padded in the `length` columns after `head`), and every
    sampled token but the last (the decode loop has not necessarily fed
    that one)."""
    start = head + length
    return tuple(
        np.concatenate(
            [
                np.arange(int(k)),
                np.arange(start - int(n), start),
                np.arange(start, start + max(int(g) - 1, 0)),
            ]
        ).astype(np.int32)
        for k, n, g in zip(base, prompt_lengths, lengths)
    )

  def prefill_columns(self, prompts: np.ndarray, lengths: np.ndarray) -> int:
    """Prompt columns (rows x width, padding included) a call without a
    `Carry` writes for these left-padded prompts, its sharing counted."""
    shards = self._batch_shards
    prefix, rest, rest_lengths = self._split_prefix(prompts, lengths, shards)
    unique, _ = self._unique_rows(rest, rest_lengths, shards)
    rows = rest.shape[0] if unique is None else len(unique)
    head = 0 if prefix is None else prefix.size
    return head + rows * rest.shape[1]

  def _split_prefix(self, prompts: np.ndarray, lengths: np.ndarray, shards):
    """(prefix[shards, P] or None, the suffixes left-padded, their lengths).

    P is the longest prefix every row's real tokens start with, leaving each
    row at least one token of its own, rounded down to a multiple of
    `share_prefix`; None when that is 0 or for one row. The prefix is
    repeated once per batch shard of the mesh, so its prefill splits evenly.
    """
    b, length = prompts.shape
    unit = self.share_prefix
    if unit <= 0 or b < 2:
      return None, prompts, lengths
    shortest = int(lengths.min())
    first = prompts[0, length - lengths[0] :][: shortest - 1]
    same = np.ones(len(first), bool)
    for i in range(1, b):
      row = prompts[i, length - lengths[i] :][: len(first)]
      same &= row == first
    common = len(first) if same.all() else int(np.argmin(same))
    p = common // unit * unit
    if p == 0:
      return None, prompts, lengths
    rest = [prompts[i, length - lengths[i] + p :].tolist() for i in range(b)]
    width = bucket(max(len(r) for r in rest))
    suffixes, suffix_lengths = left_pad(rest, width, self.pad_id)
    prefix = np.repeat(first[None, :p].astype(np.int32), shards, axis=0)
    return prefix, suffixes, suffix_lengths

  def _unique_rows(self, prompts: np.ndarray, lengths: np.ndarray, shards):
    """(rows to prefill int32[U], each row's index into them int32[B]).

    (None, None) when sharing is off or U, padded to a power of two and a
    multiple of `shards`, would not be fewer than the B rows.
    """
    b = prompts.shape[0]
    if not self.share_rows or b < 2:
      return None, None
    key = np.concatenate([prompts, lengths[:, None]], axis=1)
    _, first, inverse = np.unique(
        key, axis=0, return_index=True, return_inverse=True
    )
    order = np.argsort(first)  # distinct rows in order of first appearance
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    unique, inverse = first[order], rank[inverse.reshape(-1)]
    u = shapes.bucket(len(unique))
    u = -(-u // shards) * shards
    if u >= b:
      return None, None
    # Filler rows repeat the last distinct row (no row takes their cache).
    unique = np.concatenate([unique, np.repeat(unique[-1:], u - len(unique))])
    return unique.astype(np.int32), inverse.astype(np.int32)

  def prefill(self, params, prompts, positions, input_mask, cache, offset=0):
    """Writes the prompts into the cache, `prefill_chunk` columns at a time.

    The columns before the last whole chunks (mostly left padding) go first,
    then a loop over the whole chunks carries the cache (`prefill_chunks`),
    so the program does not grow with the prompt and attention scores stay
    [rows, chunk, cache].
    """
    length = prompts.shape[1]
    chunk = self.prefill_chunk if self.prefill_chunk > 0 else length
    n, head = divmod(length, chunk) if length > chunk else (0, length)
    logits = None
    if head:
      logits, cache = self.tokens_to_logits(
          params, prompts[:, :head], positions[:, :head],
          input_mask[:, :head], cache, jnp.int32(offset),
      )  # fmt: skip
    if not n:
      return logits, cache
    return prefill_chunks(
        self.tokens_to_logits, params, prompts, positions, input_mask, cache,
        offset, chunk=chunk, stop=n, start=head, logits=logits,
    )  # fmt: skip

  def _generate(
      self,
      params,
      prefix,
      unique,
      inverse,
      carried,
      prompts,
      prompt_lengths,
      base,
      limits,
      rng,
      temperature,
      top_p,
      *,
      max_new_tokens: int,
      greedy: bool,
      top_k: int,
      use_top_p: bool,
      keep_cache: bool,
  ):
    b, length = prompts.shape
    stop_ids = jnp.asarray(self.stop_ids or (-1,), jnp.int32)
    draw = functools.partial(
        sample_logits,
        greedy=greedy,
        top_k=top_k,
        use_top_p=use_top_p,
        temperature=temperature,
        top_p=top_p,
    )
    if self.prepare_params is not None:
      params = self.prepare_params(params)
    shared = 0 if prefix is None else prefix.shape[1]
    if carried is not None:
      shared = carried[2].shape[1]  # the carried slots come first
    size = shared + length + max_new_tokens
    axes = row_axes(self.init_cache, size)
    # The rows to prefill: every row, or the distinct ones (`_unique_rows`).
    todo, todo_lengths, todo_base = prompts, prompt_lengths, base
    if unique is not None:
      todo, todo_lengths = prompts[unique], prompt_lengths[unique]
      todo_base = base[unique]
    u = todo.shape[0]
    col = jnp.arange(length, dtype=jnp.int32)[None, :]
    pad = (length - todo_lengths)[:, None]
    input_mask = col >= pad
    positions = todo_base[:, None] + jnp.maximum(col - pad, 0)
    if carried is not None:
      old, rows, slots = carried
      cache = _carried(
          old, self.init_cache(u, size), rows, slots,
          row_axes(self.init_cache, 8), slot_axes(self.init_cache, _LONG),
      )  # fmt: skip
    elif shared:
      # The common prefix once (a row per batch shard); its cache copied to
      # every row that is prefilled.
      r = prefix.shape[0]
      _, head = self.prefill(
          params, prefix, jnp.broadcast_to(jnp.arange(shared), (r, shared)),
          jnp.ones((r, shared), bool), self.init_cache(r, size),
      )  # fmt: skip
      cache = _take_rows(head, jnp.zeros((u,), jnp.int32), axes)
    else:
      cache = self.init_cache(u, size)
    logits, cache = self.prefill(
        params, todo, positions, input_mask, cache, shared
    )
    if unique is not None:
      # Each row takes the logits and cache of its prompt's prefilled row.
      logits = logits[inverse]
      cache = _take_rows(cache, inverse, axes)
    # From here on a row's prompt is its `base` tokens longer, and the
    # cache's prompt columns start after the `shared` ones.
    prompt_lengths = prompt_lengths + base
    length += shared

    def record(state, step, tok, logp):
      tokens, logprobs, lengths, done = state
      active = ~done
      tokens = tokens.at[:, step].set(jnp.where(active, tok, self.pad_id))
      logprobs = logprobs.at[:, step].set(jnp.where(active, logp, 0.0))
      lengths = lengths + active.astype(jnp.int32)
      hit = active & jnp.any(tok[:, None] == stop_ids[None, :], -1)
      return tokens, logprobs, lengths, done | hit | (lengths >= limits), hit

    tok, logp = draw(jax.random.fold_in(rng, 0), logits)
    state = (
        jnp.full((b, max_new_tokens), self.pad_id, jnp.int32),
        jnp.zeros((b, max_new_tokens), jnp.float32),
        jnp.zeros((b,), jnp.int32),
        limits <= 0,
    )
    *state, finished = record(state, 0, tok, logp)
    state = nn.with_logical_constraint(
        tuple(state), (("batch", None), ("batch", None), ("batch",), ("batch",))
    )

    def cond(carry):
      step, _, _, _, done, _, _ = carry
      return (step < max_new_tokens) & ~jnp.all(done)

    def body(carry):
      step, tokens, logprobs, lengths, done, finished, cache = carry
      last = jax.lax.dynamic_slice_in_dim(tokens, step - 1, 1, axis=1)
      # A finished row keeps being fed (its last token is pad); its outputs
      # are masked by `record`, and one batch shape serves every step.
      pos = (prompt_lengths + step - 1)[:, None]
      logits, cache = self.tokens_to_logits(
          params, last, pos, jnp.ones((b, 1), bool), cache, length + step - 1
      )
      # The decoding head leaves them split over the vocabulary
      # (`layers.decode_logits`); this draw takes whole rows.
      logits = nn.with_logical_constraint(logits, ("batch", "vocab"))
      tok, logp = draw(jax.random.fold_in(rng, step), logits)
      tokens, logprobs, lengths, done, hit = record(
          (tokens, logprobs, lengths, done), step, tok, logp
      )
      if self.report_every:
        jax.lax.cond(
            step % self.report_every == 0,
            lambda: jax.debug.callback(
                _report, jnp.sum(lengths), jnp.sum(~done), b
            ),
            lambda: None,
        )
      return step + 1, tokens, logprobs, lengths, done, finished | hit, cache

    carry = (jnp.int32(1), *state, finished, cache)
    _, tokens, logprobs, lengths, _, finished, cache = jax.lax.while_loop(
        cond, body, carry
    )
    if self.mesh is not None:
      # Small outputs, replicated so every process can read the whole batch.
      everywhere = jax.sharding.NamedSharding(
          self.mesh, jax.sharding.PartitionSpec()
      )
      out = jax.lax.with_sharding_constraint(
          (tokens, logprobs, lengths, finished), everywhere
      )
    else:
      out = (tokens, logprobs, lengths, finished)
    return (*out, cache) if keep_cache else out
