"""The slot engine's host scheduler: a request queue over decode slots.

`SlotServer` drives a `spade.sampling.slot_engine.SlotEngine` (its compiled
programs: init, prefill-insert, generate) the way JetStream's orchestrator
drives its engine: each `step()` fills free slots from the queue (one
prefill-insert call per `prefill_rows` requests), runs one `generate`, and
hands back the requests that ended. The `generate` returns as soon as a row
ends when requests are queued (or `step(early=True)`; `run` with an
`on_result` asks for it, since the callback may queue the episode's next
turn).

Which slot a request takes. With `carry_first` (the default) a returning
episode that can continue its own free slot is served before the queue's
head; otherwise first come, first served, and with more episodes than slots
their histories are evicted. A request takes its own slot when it still
holds its history, else a slot that holds nothing, else the one whose
history has waited longest.

Carried caches. When a request's slot ends, the slot still holds its
history (the prompt and every sampled token but the last) until another
request takes it. A request whose `key` names that episode, whose prompt
extends that history, and that arrives while the history is intact (the
clock has not lapped it: dead writes have not reached it) continues it:
only the tokens after the history are prefilled. A returning turn that adds
at most `SlotEngine.append_tokens` tokens is fed them through `generate`'s
steps instead of a prefill-insert call. Otherwise the whole prompt is
prefilled again.

Shared prefixes. A request that does not continue its own slot may start
with at least a chunk of the contiguous first prompt another slot still
holds (live, or parked and not lapped): the episodes of one environment
share their first prompt. Its row then starts from that slot's prefix and
only the rest of its prompt is prefilled (`SlotEngine.share_prefixes`; the
counters `requests_shared`, `tokens_shared`). Lock-step's sampler prefills
identical first prompts once; this is the same saving for prompts that
arrive at different times and share only a prefix.

Counters: `decode_row_steps` (rows x steps that ran, live or not, plus the
`prefill_rows` rows of every prefill's first-token draw, fillers included)
and `tokens_generated`; `padding_ratio = decode_row_steps /
tokens_generated`. `lockstep_row_steps` counts a lock-step `SampleOutput`
the same way. A `PromptCounts` given to several servers adds up what they
took in: every request's prompt tokens and those taken from a cache (the
policy's `tokens/prefill*` metrics over a run's servers).

Text. `TextServer` puts a tokenizer in front of a `SlotServer`: turn t of
episode i is a request keyed by i and drawn with `fold_in(fold_in(key(seed),
i), t)`, its reply handed back as (key, ids, logprobs, text). It is the
rollout's `spade.agent.rollout.TurnServer` (each ended turn stepped in a
sandbox worker thread while the other slots decode, the next prompt
submitted with the same key, so an exact episode continues in its slot) and
what `spade.selfplay.engine.Engine.sample` queues the designer's and hint
writer's prompts on.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import TYPE_CHECKING, Any, Callable, Hashable, Sequence

import jax
import numpy as np

from spade.sampling import sampler as sampler_lib
from spade.sampling import slot_engine

if TYPE_CHECKING:
  from spade.sampling import text

Array = jax.Array


def lockstep_row_steps(out: sampler_lib.SampleOutput) -> int:
  """Decode row-steps a lock-step sampler call ran: every row, for as many
  steps as its longest row generated (the loop stops when all are done;
  the first token's draw after the prefill counts as a step)."""
  return int(out.tokens.shape[0]) * int(np.max(out.lengths, initial=0))


@dataclasses.dataclass
class PromptCounts:
  """Prompt tokens of the requests the servers sharing it started.

  Attributes:
    prompt: every request's prompt tokens, what prefilling each prompt
      whole would write (no padding).
    carried: of those, the ones taken from the request's own slot (its
      episode's history) instead of prefilled.
    shared: of those, the ones copied from another slot's prefix.
  """

  prompt: int = 0
  carried: int = 0
  shared: int = 0

  @property
  def saved(self) -> int:
    """Prompt tokens taken from a cache instead of computed again."""
    return self.carried + self.shared


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
    slot: the slot it ended in (the server moves live slots to the front
      of their shards before a call in place: `SlotEngine.runs_in_place`).
    carried: prompt tokens taken from a cache instead of prefilled (its
      slot's history, or another slot's shared prefix).
  """

  request: Request
  tokens: np.ndarray
  logprobs: np.ndarray
  finished: bool
  slot: int
  carried: int


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


class SlotServer:
  """The host loop over a `SlotEngine`: a queue, slots, counters (see the
  module docstring).

  Args:
    engine: the engine whose programs it runs.
    params: the model parameters (prepared once here, e.g. unstacked).
    carry_first: serve a returning episode that can continue its own free
      slot before the queue's head (see `_assign`).
    counts: the `PromptCounts` this server adds its requests' prompts to
      (shared with other servers); default a record of its own.
    programs: the programs to run (default `engine.programs`; `spade.
      compile` passes stand-ins that capture their arguments).
  """

  def __init__(
      self,
      engine: slot_engine.SlotEngine,
      params,
      *,
      carry_first: bool = True,
      counts: PromptCounts | None = None,
      programs: slot_engine.Programs | None = None,
  ):
    self.engine = engine
    self.counts = counts if counts is not None else PromptCounts()
    self.carry_first = carry_first
    self.programs = programs or engine.programs
    self.params = self.programs.prepare(params)
    self.state = self.programs.init()
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
    self.prefix_calls = 0  # of them, on a prefix of each shard's slots
    self.swap_calls = 0  # swap programs run to move live slots forward
    self.slots_swapped = 0
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
        self.counts.prompt += len(r.prompt)
        self.counts.carried += n
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
      self.counts.prompt += len(r.prompt)
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
        self.counts.carried += n
      else:
        self.requests_shared += 1
        self.tokens_shared += n
        self.counts.shared += n
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
    t0 = time.perf_counter()
    self.state, out = self.programs.prefill_insert(
        self.params, self.state, host_rows, reqs, window
    )
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
    if window == eng.cache_length:
      self._compact()
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
    prefix = 0
    if (
        eng.runs_in_place
        and index is not None
        and window == eng.cache_length
        and (np.sort(index, axis=1) == np.arange(index.shape[1])).all()
    ):
      # Each shard's live slots are among its first `rows / shards`: the
      # call runs on those where they lie (no take, no put).
      prefix, index = rows, None
      self.prefix_calls += 1
    self.state, out = self.programs.generate(
        self.params, self.state, np.bool_(early), np.int32(window - held), arm,
        window, index, prefix,
    )  # fmt: skip
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

  def _compact(self) -> None:
    """Moves each shard's live slots to its first `rows / shards` (the rows
    the next generate runs on), each swapped with a slot there that is not
    live (`SlotEngine.swap`: what a slot holds moves with it, its history
    included), so a gathered call on the whole cache runs on them in place
    (`generate`'s `prefix`) instead of taking their cache out. One swap a
    shard per call of the swap program."""
    eng = self.engine
    if not eng.runs_in_place or self.programs.swap is None:
      return
    rows, index = self._rows()
    if index is None:
      return
    sh = eng.batch_shards
    per, b = eng.slots // sh, rows // sh
    live = lambda k, i: self.slots[k * per + i].request is not None
    moves = []
    for k in range(sh):
      out = [i for i in range(b, per) if live(k, i)]
      into = [i for i in range(b) if not live(k, i)]
      moves.append(list(zip(out, into)))
    for j in range(max(len(m) for m in moves)):
      pairs = np.zeros((sh, 2), np.int32)
      for k, m in enumerate(moves):
        if j < len(m):
          pairs[k] = m[j]
          self._swap_host(k * per + m[j][0], k * per + m[j][1])
      self.state = self.programs.swap(self.state, pairs)
      self.swap_calls += 1

  def _swap_host(self, a: int, b: int) -> None:
    """The host's view of slots a and b swapped, as `SlotEngine.swap` swaps
    their rows."""
    self.slots[a], self.slots[b] = self.slots[b], self.slots[a]
    where = {a: b, b: a}
    self._held = {k: where.get(s, s) for k, s in self._held.items()}
    self._arming = [(where.get(s, s), r, f) for s, r, f in self._arming]
    self.slots_swapped += 2

  def _rows(self) -> tuple[int, np.ndarray | None]:
    """The rows the next `generate` runs on (the smallest of
    `SlotEngine.rows` holding each shard's live slots) and their slots'
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


class TextServer:
  """A `SlotServer` behind the tokenizer: the rollout's `TurnServer`.

  Turn t of episode i is drawn with `fold_in(fold_in(key(seed), i), t)`, so
  its tokens depend on neither its slot nor the other episodes. Without
  `carry` each turn is a request of its own name and prefills its whole
  history (`config.agent.carry_cache=False`).
  """

  def __init__(
      self,
      server: SlotServer,
      tokenizer: text.TokenizerLike,
      max_new_tokens: int,
      carry: bool = True,
  ):
    self.server = server
    self.max_new_tokens = max_new_tokens
    self.carry = carry
    self._decode = tokenizer.decode
    self._stops = frozenset(int(i) for i in tokenizer.stop_ids)

  @property
  def decode_row_steps(self) -> int:
    return self.server.decode_row_steps

  @property
  def tokens_generated(self) -> int:
    return self.server.tokens_generated

  @property
  def busy(self) -> bool:
    return bool(self.server.queue) or self.server.live > 0

  def submit(self, key: int, prompt: list[int], seed: int, turn: int) -> None:
    """Queues turn `turn` of episode `key` (see the class docstring)."""
    rng = jax.random.fold_in(
        jax.random.fold_in(jax.random.key(seed), key), turn
    )
    name = key if self.carry else (key, turn)
    self.server.submit(Request(name, list(prompt), self.max_new_tokens, rng))

  def step(self) -> list[tuple[Any, list[int], list[float], str]]:
    """One `SlotServer.step`: (key, ids, logprobs, text) of each turn that
    ended in it."""
    out = []
    for r in self.server.step():
      ids = r.tokens.tolist()
      # A stop id, when hit, stays in the ids and logprobs, not in the text.
      shown = ids[:-1] if r.finished and ids and ids[-1] in self._stops else ids
      key = r.request.key if self.carry else r.request.key[0]
      out.append((key, ids, r.logprobs.tolist(), self._decode(shown)))
    return out
