"""The slot engine and its scheduler against the lock-step sampler, on the
tiny model.

The model of tests/sampling/test_sampler.py: two sliding layers (window 4)
and one global layer, so every ring buffer wraps; the carried-cache tests
use its all-global variant (ring buffers cannot be continued).
"""

import functools

import jax
import ml_collections
import numpy as np
import pytest

from spade import compile as compile_lib
from spade import config as config_lib
from spade.model import sharding
from spade.model import transformer as T
from spade.sampling import sampler as S
from spade.sampling import slot_engine
from spade.sampling import slot_server as E

PAD, BOS, EOS = 256, 257, 258
PROMPTS = [
    [BOS, 5, 6, 7, 8, 9, 10],
    [BOS, 100],
    [BOS, 3, 4, 5],
    [BOS],
    [BOS, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49],
    [BOS, 7, 7],
]
LIMITS = [8, 3, 6, 1, 5, 7]
NEW = 8  # the most new tokens any request here asks for


def _cfg(sliding_window=4):
  cfg = config_lib.base_config().model
  cfg.num_layers = 3
  cfg.sliding_window = sliding_window
  cfg.global_every = 3
  return cfg


@pytest.fixture(scope="module")
def ring():
  cfg = _cfg()
  return cfg, T.init_params(cfg, jax.random.key(0))


@pytest.fixture(scope="module")
def flat():
  cfg = _cfg(sliding_window=0)
  return cfg, T.init_params(cfg, jax.random.key(0))


_ENGINES = {}


def _engine(cfg, **kw):
  """One engine per model and settings, shared by the tests (each compiles
  its programs once)."""
  kw.setdefault("slots", 2)
  kw.setdefault("cache_length", 48)
  kw.setdefault("prefill_chunk", 4)
  kw.setdefault("decode_steps", 3)
  if "rules" in kw:
    kw["rules"] = tuple((n, tuple(t) if isinstance(t, list) else t)
                        for n, t in kw["rules"])  # fmt: skip
  key = (cfg.sliding_window, cfg.kv_cache_dtype, tuple(sorted(kw.items())))
  if key not in _ENGINES:
    fns = T.sampling_fns(cfg, T.Role.AGENT)
    _ENGINES[key] = slot_engine.SlotEngine(
        fns.tokens_to_logits, fns.init_cache, fns.prepare_params,
        pad_id=PAD, **kw
    )  # fmt: skip
  return _ENGINES[key]


_SAMPLERS = {}


def _alone(cfg, params, request, temperature, stop_ids=()):
  """The lock-step sampler on this request alone, with its key."""
  key = (cfg.sliding_window, cfg.kv_cache_dtype, stop_ids)
  if key not in _SAMPLERS:  # one compiled sampler per model and stop ids
    _SAMPLERS[key] = S.Sampler(
        *T.sampling_fns(cfg, T.Role.AGENT), pad_id=PAD, stop_ids=stop_ids
    )
  # One max_new_tokens for all (a row limit ends each): fewer compiles.
  out = _SAMPLERS[key](
      params, [list(request.prompt)], max_new_tokens=NEW,
      row_max_new_tokens=np.array([request.max_new_tokens]),
      rng=request.rng, temperature=temperature,
  )  # fmt: skip
  n = int(out.lengths[0])
  return out.tokens[0, :n], out.logprobs[0, :n]


def _requests(prompts=PROMPTS, limits=LIMITS, seed=0):
  return [
      E.Request(key=i, prompt=p, max_new_tokens=m,
                rng=jax.random.fold_in(jax.random.key(seed), i))
      for i, (p, m) in enumerate(zip(prompts, limits))
  ]  # fmt: skip


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_each_request_samples_what_the_lockstep_sampler_samples_alone(
    ring, temperature
):
  """Six requests over two slots, three arriving later (when earlier ones
  end): each returns the tokens and log-probs of a lock-step batch of one
  with its key, whatever slot and step it ran in."""
  cfg, params = ring
  engine = _engine(cfg, temperature=temperature)
  server = E.SlotServer(engine, params)
  reqs = _requests()
  late = list(reqs[3:])

  def arrive(_):
    if late:
      server.submit(late.pop(0))

  results = server.run(reqs[:3], on_result=arrive)
  assert sorted(r.request.key for r in results) == list(range(6))
  assert {r.slot for r in results} == {0, 1}
  for res in results:
    tokens, logprobs = _alone(cfg, params, res.request, temperature)
    np.testing.assert_array_equal(res.tokens, tokens)
    np.testing.assert_allclose(res.logprobs, logprobs, atol=1e-5)
    assert len(res.tokens) == res.request.max_new_tokens


def test_an_int8_cache_samples_what_the_lockstep_sampler_samples(ring):
  """`model.kv_cache_dtype="int8"`: the engine's cache holds int8 keys and
  values beside float32 scales, and each request (six over two slots, the
  rings wrapping) gets the tokens the lock-step sampler on the same int8
  cache gives it alone."""
  cfg, params = ring
  cfg = ml_collections.ConfigDict(cfg.to_dict())
  cfg.kv_cache_dtype = "int8"
  engine = _engine(cfg, temperature=0.0)
  layer = jax.eval_shape(lambda: engine.init_cache(2, 48))["layer_0"]
  assert layer["k"].dtype == layer["v"].dtype == np.int8
  assert layer["k_scale"].shape == layer["k"].shape[:-1]
  results = E.SlotServer(engine, params).run(_requests())
  assert len(results) == 6
  for res in results:
    tokens, logprobs = _alone(cfg, params, res.request, 0.0)
    np.testing.assert_array_equal(res.tokens, tokens)
    np.testing.assert_allclose(res.logprobs, logprobs, atol=1e-5)


def test_the_same_requests_in_another_order_and_layout_sample_the_same(ring):
  """Sampled: reversed arrival, four slots and two-row prefills give each
  request the same tokens; one compile per program whatever the order."""
  cfg, params = ring
  reqs = _requests(seed=3)
  a = _engine(cfg, slots=2)
  first = {r.request.key: r for r in E.SlotServer(a, params).run(reqs)}
  again = {r.request.key: r for r in E.SlotServer(a, params).run(reqs[::-1])}
  b = _engine(cfg, slots=4, prefill_rows=2, decode_steps=2)
  other = {r.request.key: r for r in E.SlotServer(b, params).run(reqs[::-1])}
  for k in first:
    np.testing.assert_array_equal(first[k].tokens, again[k].tokens)
    np.testing.assert_array_equal(first[k].tokens, other[k].tokens)
    np.testing.assert_allclose(first[k].logprobs, other[k].logprobs, atol=1e-5)
  assert a.traces == {"init": 1, "prefill_insert": 1, "generate": 1}
  assert b.traces == {"init": 1, "prefill_insert": 1, "generate": 1}


def test_stop_ids_end_a_row_and_free_its_slot(ring):
  """A stop id ends a request (kept as its last token, `finished`), its
  slot is refilled, and the counters add up."""
  cfg, params = ring
  reqs = _requests()
  greedy = E.SlotServer(_engine(cfg, temperature=0.0), params).run(reqs)
  stop = int(next(r for r in greedy if r.request.key == 0).tokens[1])
  engine = _engine(cfg, stop_ids=(stop,), temperature=0.0, slots=2)
  server = E.SlotServer(engine, params)
  results = server.run(reqs)
  by_key = {r.request.key: r for r in results}
  for req in reqs:
    tokens, _ = _alone(cfg, params, req, 0.0, stop_ids=(stop,))
    res = by_key[req.key]
    np.testing.assert_array_equal(res.tokens, tokens)
    assert res.finished == (stop in tokens.tolist())
  assert by_key[0].finished and len(by_key[0].tokens) <= 2
  assert server.live == 0 and not server.queue
  # Both slots served several requests.
  assert min(np.bincount([r.slot for r in results])) >= 2
  assert server.tokens_generated == sum(len(r.tokens) for r in results)
  steps = server.decode_row_steps - server.prefill_calls  # one row a call
  assert steps % engine.slots == 0 and steps > 0
  assert server.padding_ratio >= 1.0


def _next(prompt, res, obs):
  return list(prompt) + res.tokens.tolist() + obs


@pytest.mark.parametrize("temperature,carry_first", [(0.0, True), (1.0, False)])
def test_a_returning_turn_continues_its_slots_cache(
    flat, temperature, carry_first
):
  """Three episodes, three turns each, over two slots: a turn whose slot
  still holds its episode continues it (only the new tokens prefilled), one
  whose slot was taken is prefilled whole, and both sample what the
  lock-step sampler samples on the whole history alone. Served carried
  turns first, every later turn continues; first come first served, the
  third episode's turns evict the others' histories."""
  cfg, params = flat
  engine = _engine(cfg, temperature=temperature, cache_length=64)
  assert engine.can_continue
  counts = E.PromptCounts()
  server = E.SlotServer(engine, params, carry_first=carry_first, counts=counts)
  turns = {k: 0 for k in range(3)}
  results = []

  def arrive(res):
    results.append(res)
    k = res.request.key
    turns[k] += 1
    if turns[k] < 3:
      obs = [60 + k, 61, 62][: 1 + turns[k]]
      server.submit(
          E.Request(k, _next(res.request.prompt, res, obs), 4 + k,
                    jax.random.fold_in(jax.random.key(9), 10 * k + turns[k]))
      )  # fmt: skip

  server.run(_requests(PROMPTS[:3], [5, 3, 6]), on_result=arrive)
  assert len(results) == 9
  carried = [r for r in results if r.carried]
  assert len(carried) == (6 if carry_first else 0)
  last = {}
  for res in results:  # a continued turn holds the previous prompt + reply
    if res.carried:
      prompt, tokens = last[res.request.key]
      assert res.carried == len(prompt) + len(tokens) - 1
    last[res.request.key] = (res.request.prompt, res.tokens)
  assert server.tokens_carried == sum(r.carried for r in results)
  # The counts record: every prompt whole, the carried part saved.
  assert counts.prompt == sum(len(r.request.prompt) for r in results)
  assert counts.carried == counts.saved == server.tokens_carried
  # Each continued turn adds 2-4 tokens: all fed through generate's steps.
  assert server.requests_appended == len(carried)
  for res in results:
    tokens, logprobs = _alone(cfg, params, res.request, temperature)
    np.testing.assert_array_equal(res.tokens, tokens)
    np.testing.assert_allclose(res.logprobs, logprobs, atol=1e-5)
  assert engine.traces == {"init": 1, "prefill_insert": 1, "generate": 1}


@pytest.mark.parametrize("on_mesh", [False, True])
@pytest.mark.parametrize("axis,per_row", [(0, 1), (1, 1), (1, 2), (0, 3)])
def test_rows_take_and_put_move_each_shards_rows(axis, per_row, on_mesh):
  """`_rows_take` and `_rows_put` (each shard's rows, within the shard)
  against numpy's indexing: 2 shards of 4 rows, 3 taken from each, a time axis
  after the row axis whose steps past its end are dropped. On a mesh (data 2,
  tensor 2: the other axis left to the partitioner) each chip moves its own
  rows under `shard_map`, and x stays sharded on its rows."""
  mesh = None
  if on_mesh:
    mesh = sharding.make_mesh(
        ml_collections.ConfigDict(dict(data=2, fsdp=1, tensor=2)),
        jax.devices()[:4],
    )
  rng = np.random.default_rng(axis + 10 * per_row)
  sh, per_shard, b, t = 2, 4, 3, 3
  shape = [5, 5, 5, 6]
  shape[axis] = sh * per_shard * per_row
  x = rng.normal(size=shape).astype(np.float32)
  index = np.stack([rng.permutation(per_shard)[:b] for _ in range(sh)])
  index = index.astype(np.int32)
  rows = (np.arange(sh)[:, None] * per_shard + index).reshape(-1)

  def split(a, n):  # the row axis first, as (rows, entries per row)
    a = a.reshape(a.shape[:axis] + (n, per_row) + a.shape[axis + 1 :])
    return np.moveaxis(a, axis, 0)

  def join(a, like):
    return np.moveaxis(a, 0, axis).reshape(like.shape)

  spec = (axis, per_row)
  if on_mesh:
    row = jax.sharding.PartitionSpec(*(None,) * axis, ("data", "fsdp"))
    x = jax.device_put(x, jax.sharding.NamedSharding(mesh, row))
  take = jax.jit(lambda x, ix: slot_engine._rows_take(x, spec, ix, mesh))
  got = take(x, index)
  if on_mesh:
    assert got.sharding.spec[axis] == ("data", "fsdp")
  got = np.asarray(got)
  x = np.asarray(x)
  np.testing.assert_array_equal(got, join(split(x, sh * per_shard)[rows], got))
  y = rng.normal(size=got.shape).astype(np.float32)
  want = split(x, sh * per_shard).copy()
  want[rows] = split(y, sh * b)
  put = jax.jit(functools.partial(slot_engine._rows_put, spec=spec, mesh=mesh))
  put = put(x, y, index=index)
  np.testing.assert_array_equal(np.asarray(put), join(want, x))
  # Only the times `steps` of the rows (y holds 3 steps; time 7 is past
  # the axis and dropped).
  steps = np.array([4, 0, 7], np.int32)
  y = rng.normal(size=got.shape[:t] + (3,)).astype(np.float32)
  want, ys = split(x, sh * per_shard).copy(), split(y, sh * b)
  for k, step in enumerate(steps[:2]):
    want[rows, ..., step] = ys[..., k]
  put = jax.jit(lambda x, y, ix, steps: slot_engine._rows_put(
      x, y, spec, ix, t, steps, mesh
  ))(x, y, index, steps)  # fmt: skip
  np.testing.assert_array_equal(np.asarray(put), join(want, x))


def test_max_gathered_rows_caps_the_gathered_counts():
  """Counts above `max_gathered_rows` are not compiled or chosen: a call
  whose live slots need more runs on every slot."""
  none = lambda *a: None
  make = lambda **kw: slot_engine.SlotEngine(
      none, none, pad_id=PAD, slots=16, min_rows=2, **kw
  )
  assert make().rows == (2, 3, 4, 6, 8, 12, 16)
  assert make(max_gathered_rows=6).rows == (2, 3, 4, 6, 16)
  assert make(max_gathered_rows=5).rows == (2, 3, 4, 16)
  assert make(max_gathered_rows=1).rows == (16,)
  with pytest.raises(ValueError, match="max_gathered_rows=-1"):
    make(max_gathered_rows=-1)
  c = config_lib.base_config()
  c.sampling.max_gathered_rows = -1
  with pytest.raises(config_lib.ConfigError, match="max_gathered_rows=-1"):
    config_lib.validate(c)


def test_put_steps_from_is_checked_and_reaches_the_engine():
  """`sampling.put_steps_from` under 1 is refused by the config and the
  engine alike; a valid one is the engine `spade.compile` builds, as is
  `sampling.in_place`."""
  none = lambda *a: None
  with pytest.raises(ValueError, match="put_steps_from=0"):
    slot_engine.SlotEngine(none, none, pad_id=PAD, put_steps_from=0)
  c = config_lib.base_config()
  c.sampling.put_steps_from = 0
  with pytest.raises(config_lib.ConfigError, match="put_steps_from=0"):
    config_lib.validate(c)
  c = config_lib.base_config()
  c.sampling.put_steps_from = 9
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  engine = compile_lib.slot_engine(c, mesh, c.mesh.rules, "agent")
  # "auto": in place on TPU only, not on this CPU.
  assert engine.put_steps_from == 9 and engine.in_place is None
  assert not engine.runs_in_place
  c.sampling.in_place = "on"
  assert compile_lib.slot_engine(c, mesh, c.mesh.rules, "agent").in_place
  c.sampling.in_place = "yes"
  with pytest.raises(config_lib.ConfigError, match="sampling.in_place"):
    config_lib.validate(c)


@pytest.mark.slow
@pytest.mark.parametrize(
    "model,temperature", [("flat", 0.0), ("flat", 1.0), ("ring", 1.0)]
)
def test_generate_on_the_live_rows_samples_what_each_samples_alone(
    request, model, temperature
):
  """Four slots, `min_rows=1`: each generate runs on the live slots
  gathered into 1, 2, 3 or 4 rows. Three episodes play three turns each
  (later turns continue their slots' caches on the all-global model, on
  windows of it) while three one-turn requests arrive as others end; every
  request samples what the lock-step sampler samples on it alone, and the
  row-steps count only the rows that ran."""
  cfg, params = request.getfixturevalue(model)
  engine = _engine(cfg, slots=4, min_rows=1, temperature=temperature,
                   cache_length=64, min_window=8)  # fmt: skip
  assert engine.rows == (1, 2, 3, 4)
  server = E.SlotServer(engine, params)
  turns, late = {k: 0 for k in range(3)}, _requests(seed=3)[3:]
  results = []

  def arrive(res):
    results.append(res)
    k = res.request.key
    if k in turns and turns[k] < 2:
      turns[k] += 1
      server.submit(
          E.Request(k, _next(res.request.prompt, res, [60 + k, 61]), 3 + k,
                    jax.random.fold_in(jax.random.key(4), 10 * k + turns[k]))
      )  # fmt: skip
    elif late:
      server.submit(late.pop(0))

  server.run(_requests(PROMPTS[:3], [5, 2, 6]), on_result=arrive)
  assert len(results) == 12
  assert set(server.rows) - {4}, server.rows  # some calls ran on fewer rows
  assert sum(server.rows.values()) == server.generate_calls
  if engine.can_continue:  # windows below the whole cache ran too
    assert server.requests_carried == 6
    assert set(server.windows) - {engine.cache_length}, server.windows
  for res in results:
    tokens, logprobs = _alone(cfg, params, res.request, temperature)
    np.testing.assert_array_equal(res.tokens, tokens)
    np.testing.assert_allclose(res.logprobs, logprobs, atol=1e-5)
  # No more decode row-steps than the rows that ran, every step.
  assert (
      server.decode_row_steps
      < engine.slots * (server.clock - engine.cache_length)
      + server.prefill_calls * engine.prefill_rows
  )


def test_gathered_calls_put_back_the_slots_a_rings_wrap_wrote(ring):
  """The sliding layers' ring holds 4 slots and a call makes 3 steps, so
  most calls' steps wrap around it. Rows that live through several calls
  on fewer rows than the slots (each call takes them out, steps them and
  puts back the slots its steps wrote, the wrapped ones too) sample what
  each samples alone."""
  cfg, params = ring
  engine = _engine(cfg, slots=4, min_rows=1, temperature=1.0,
                   cache_length=64, min_window=8, put_steps_from=1,
                   in_place=False)  # fmt: skip
  server = E.SlotServer(engine, params)
  results = []
  server.run(_requests(PROMPTS[:3], [NEW, 3, 7], seed=5),
             on_result=results.append)  # fmt: skip
  # The longest row ran through four calls, none on every slot.
  assert sum(server.rows.values()) == 4 and 4 not in server.rows, server.rows
  assert server.prefix_calls == 0
  for res in results:
    tokens, logprobs = _alone(cfg, params, res.request, 1.0)
    np.testing.assert_array_equal(res.tokens, tokens)
    np.testing.assert_allclose(res.logprobs, logprobs, atol=1e-5)


def test_calls_on_the_first_slots_run_where_they_lie(ring):
  """The same requests with `in_place`: the live slots are moved to the
  front (`SlotEngine.swap`) and each gathered call runs on them in place
  (`generate`'s prefix: the cache read and written where it lies, no take,
  no put); each request still samples what it samples alone."""
  cfg, params = ring
  engine = _engine(cfg, slots=4, min_rows=1, temperature=1.0,
                   cache_length=64, min_window=8, in_place=True)  # fmt: skip
  assert engine.runs_in_place
  server = E.SlotServer(engine, params)
  results = []
  server.run(_requests(PROMPTS[:3], [NEW, 3, 7], seed=5),
             on_result=results.append)  # fmt: skip
  # Slot 1's request ends first: slot 2's moves into it (one swap), and
  # every call runs in place (none on every slot: at most 3 live).
  assert server.prefix_calls == server.generate_calls > 0, server.rows
  assert server.swap_calls == 1 and server.slots_swapped == 2
  for res in results:
    tokens, logprobs = _alone(cfg, params, res.request, 1.0)
    np.testing.assert_array_equal(res.tokens, tokens)
    np.testing.assert_allclose(res.logprobs, logprobs, atol=1e-5)


def test_windows_are_few_and_bounded(ring, flat):
  """Windows: w and 3w/2 per octave from `min_window`, then the whole
  cache; a ring-buffer model (or min_window 0) only ever the whole cache."""
  # The engine takes the first three (not `share_prefix`).
  flat_fns = T.sampling_fns(flat[0], T.Role.AGENT)[:3]
  engine = slot_engine.SlotEngine(
      *flat_fns, pad_id=PAD, cache_length=48, prefill_chunk=4, min_window=8
  )
  assert engine.windows == (8, 12, 16, 24, 32, 48)
  assert [engine.window(n) for n in (1, 9, 13, 33, 49)] == [8, 12, 16, 48, 48]
  off = slot_engine.SlotEngine(
      *flat_fns, pad_id=PAD, cache_length=48, prefill_chunk=4, min_window=0
  )
  assert off.windows == (48,)
  ring_fns = T.sampling_fns(ring[0], T.Role.AGENT)[:3]
  ring_engine = slot_engine.SlotEngine(
      *ring_fns, pad_id=PAD, cache_length=48, prefill_chunk=4, min_window=8
  )
  assert ring_engine.windows == (48,)


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_calls_on_a_window_sample_what_the_whole_cache_samples(
    flat, temperature
):
  """Windows of 8 to 48 steps of a 64-step cache: four episodes of four
  turns over three slots, two-row prefills. Every turn, continued in its
  slot or prefilled whole, samples what the lock-step sampler samples on
  its whole history alone; the calls ran on several windows (prompts sit
  just before the clock's start, time 64, ring slot 0: windows wrap around
  the cache's end), each program compiled at most once per window."""
  cfg, params = flat
  engine = _engine(cfg, temperature=temperature, cache_length=64, slots=3,
                   prefill_rows=2, min_window=8)  # fmt: skip
  server = E.SlotServer(engine, params)
  turns = {k: 0 for k in range(4)}
  results = []

  def arrive(res):
    results.append(res)
    k = res.request.key
    turns[k] += 1
    if turns[k] < 4:
      obs = [60 + k, 61, 62][: 1 + (turns[k] + k) % 3]
      server.submit(
          E.Request(
              k, _next(res.request.prompt, res, obs), 3 + (k + turns[k]) % 4,
              jax.random.fold_in(jax.random.key(4), 10 * k + turns[k]),
          )
      )  # fmt: skip

  server.run(_requests(PROMPTS[:4], [5, 3, 6, 4]), on_result=arrive)
  assert len(results) == 16
  assert sum(bool(r.carried) for r in results) >= 6
  for res in results:
    tokens, logprobs = _alone(cfg, params, res.request, temperature)
    np.testing.assert_array_equal(res.tokens, tokens)
    np.testing.assert_allclose(res.logprobs, logprobs, atol=1e-5)
  assert len(server.windows) > 1
  assert engine.traces["generate"] == len(server.windows)
  assert engine.traces["prefill_insert"] <= len(engine.windows)
  # The generate calls attended over fewer steps than the whole cache.
  steps = server.decode_row_steps - engine.prefill_rows * server.prefill_calls
  assert server.window_row_steps < steps * engine.cache_length


def test_a_continued_turn_samples_what_a_re_prefill_samples(flat):
  """One episode's second turn, once continuing its slot and once on an
  engine that never keeps it (another request took the slot between)."""
  cfg, params = flat
  engine = _engine(cfg, slots=1, temperature=1.0)
  first = _requests(PROMPTS[:1], [6])[0]
  (one,) = E.SlotServer(engine, params).run([first])
  again = E.Request(0, _next(first.prompt, one, [70, 71]), 5,
                    jax.random.key(11))  # fmt: skip
  server = E.SlotServer(engine, params)
  server.run([first])
  (kept,) = server.run([again])
  assert kept.carried == len(first.prompt) + len(one.tokens) - 1
  assert server.requests_appended == 1
  # The same continued turn through a prefill-insert of its new tokens.
  prefill = _engine(cfg, slots=1, temperature=1.0, append_tokens=0)
  server = E.SlotServer(prefill, params)
  server.run([first])
  (inserted,) = server.run([again])
  assert inserted.carried == kept.carried and server.requests_appended == 0
  np.testing.assert_array_equal(kept.tokens, inserted.tokens)
  np.testing.assert_allclose(kept.logprobs, inserted.logprobs, atol=1e-5)
  server = E.SlotServer(engine, params)
  server.run([first])
  server.run([E.Request(1, [BOS, 9], 2, jax.random.key(1))])
  (fresh,) = server.run([again])
  assert fresh.carried == 0
  np.testing.assert_array_equal(kept.tokens, fresh.tokens)
  np.testing.assert_allclose(kept.logprobs, fresh.logprobs, atol=1e-5)


@pytest.mark.parametrize(
    "temperature,min_window", [(0.0, 8), (1.0, 8), (1.0, 0)]
)
def test_a_shared_prefix_samples_what_a_whole_prefill_samples(
    flat, temperature, min_window
):
  """Requests whose prompts start with another slot's prompt (live or
  parked) copy that prefix's cache and prefill only the rest: one shares
  all but its last token, one only part of the source's prompt (the
  source's later keys must not leak into it). Each samples what the
  lock-step sampler samples on its whole prompt alone; with sharing off,
  nothing is shared and the tokens are the same."""
  cfg, params = flat
  a = [BOS] + list(range(20, 31))
  prompts = [a + [40, 41], [BOS, 7, 8], a + [50], a[:9] + [60, 61, 62],
             a + [40, 41], a + [50, 70, 71]]  # fmt: skip
  limits = [6, 4, 5, 3, 6, 4]
  out, counts, shared = {}, E.PromptCounts(), 0
  for share in (True, False):
    engine = _engine(cfg, temperature=temperature, cache_length=64,
                     slots=3, min_window=min_window,
                     share_prefixes=share)  # fmt: skip
    # One counts record over both servers adds up what each took in.
    server = E.SlotServer(engine, params, counts=counts)
    reqs = _requests(prompts, limits, seed=5)
    late = list(reqs[2:])

    def arrive(_, late=late, server=server):
      if late:
        server.submit(late.pop(0))

    results = server.run(reqs[:2], on_result=arrive)
    by_key = {r.request.key: r for r in results}
    out[share] = by_key
    for res in results:
      tokens, logprobs = _alone(cfg, params, res.request, temperature)
      np.testing.assert_array_equal(res.tokens, tokens)
      np.testing.assert_allclose(res.logprobs, logprobs, atol=1e-5)
    if share:
      assert by_key[3].carried == 9  # the part of a it shares
      assert by_key[4].carried == 13  # all but its last token
      assert by_key[2].carried >= 12 and by_key[5].carried >= 12
      assert server.requests_shared == 4
      assert server.tokens_shared == sum(by_key[k].carried for k in range(2, 6))
      shared = server.tokens_shared
    else:
      assert server.requests_shared == 0
      assert all(r.carried == 0 for r in results)
  for k, res in out[True].items():
    np.testing.assert_array_equal(res.tokens, out[False][k].tokens)
  assert counts.prompt == 2 * sum(map(len, prompts))
  assert counts.shared == counts.saved == shared > 0 and counts.carried == 0


def test_ring_buffer_models_re_prefill_every_turn(ring):
  cfg, params = ring
  engine = _engine(cfg, slots=1)
  assert not engine.can_continue
  server = E.SlotServer(engine, params)
  (one,) = server.run(_requests(PROMPTS[:1], [4]))
  req = E.Request(0, _next(PROMPTS[0], one, [70]), 4, jax.random.key(2))
  (two,) = server.run([req])
  assert two.carried == 0
  np.testing.assert_array_equal(two.tokens, _alone(cfg, params, req, 1.0)[0])


def test_a_request_that_does_not_fit_the_cache_is_refused(ring):
  cfg, params = ring
  server = E.SlotServer(_engine(cfg, cache_length=16), params)
  with pytest.raises(ValueError, match="cache_length=16"):
    server.submit(E.Request(0, [BOS] * 10, 7, jax.random.key(0)))
  with pytest.raises(ValueError, match="multiple of prefill_chunk"):
    _engine(cfg, cache_length=18)


def test_lockstep_row_steps_count_the_longest_row():
  out = S.SampleOutput(
      tokens=np.zeros((4, 8), np.int32), logprobs=np.zeros((4, 8)),
      lengths=np.array([1, 5, 3, 2]), finished=np.zeros(4, bool),
  )  # fmt: skip
  assert E.lockstep_row_steps(out) == 20


@pytest.mark.slow
@pytest.mark.parametrize("slots,min_rows", [(4, 0), (8, 4)])
def test_sharded_engine_samples_what_one_device_samples(ring, slots, min_rows):
  """Four batch shards; with `min_rows`, generate also runs on one live
  slot a shard (gathered within each shard)."""
  cfg, params = ring
  mesh = sharding.make_mesh(
      ml_collections.ConfigDict(dict(data=2, fsdp=2, tensor=2))
  )
  rules = config_lib.base_config().mesh.rules
  placed = sharding.shard_params(params, mesh, rules)
  engine = _engine(cfg, slots=slots, prefill_rows=4, mesh=mesh, rules=rules,
                   min_rows=min_rows)  # fmt: skip
  server = E.SlotServer(engine, placed)
  results = server.run(_requests())
  assert engine.rows == ((4, 8) if min_rows else (4,))
  assert set(server.rows) == set(engine.rows)
  assert server.prefix_calls == 0  # ("auto": in place on TPU only)
  ref = E.SlotServer(_engine(cfg, slots=4), params).run(_requests())
  ref = {r.request.key: r for r in ref}
  for res in results:
    np.testing.assert_array_equal(res.tokens, ref[res.request.key].tokens)
    np.testing.assert_allclose(
        res.logprobs, ref[res.request.key].logprobs, atol=1e-5
    )
  assert engine.traces["generate"] == len(engine.rows)


@pytest.mark.slow
def test_live_slots_move_to_the_front_of_their_shards(ring):
  """Four batch shards of two slots: the four short requests take each
  shard's first slot, the long ones its second; once the short ones end,
  one swap call moves each shard's live slot to its front, and the rest
  run on those 4 rows in place. Every request samples what it samples on
  one device."""
  cfg, params = ring
  mesh = sharding.make_mesh(
      ml_collections.ConfigDict(dict(data=2, fsdp=2, tensor=2))
  )
  rules = config_lib.base_config().mesh.rules
  placed = sharding.shard_params(params, mesh, rules)
  engine = _engine(cfg, slots=8, prefill_rows=4, mesh=mesh, rules=rules,
                   min_rows=4, in_place=True)  # fmt: skip
  requests = _requests(PROMPTS + PROMPTS[:2], [1, 1, 1, 1, 6, 7, 8, 5])
  server = E.SlotServer(engine, placed)
  results = server.run(requests)
  assert server.swap_calls == 1 and server.slots_swapped == 8
  assert server.prefix_calls == server.rows[4] > 0, server.rows
  ref = E.SlotServer(_engine(cfg, slots=4), params).run(requests)
  ref = {r.request.key: r for r in ref}
  for res in results:
    np.testing.assert_array_equal(res.tokens, ref[res.request.key].tokens)
    np.testing.assert_allclose(
        res.logprobs, ref[res.request.key].logprobs, atol=1e-5
    )


@pytest.mark.slow
def test_a_draw_split_over_the_vocabulary_samples_what_one_device_samples():
  """A vocabulary the mesh's fsdp x tensor (4) divides: the prepared tables
  are split by their rows, each chip draws its top-k candidates from the
  logits its quarter of the head made (`sampler.sample_split`), and the
  tokens are those one device samples."""
  cfg = _cfg()
  cfg.vocab_size = 512
  params = T.init_params(cfg, jax.random.key(1))
  mesh = sharding.make_mesh(
      ml_collections.ConfigDict(dict(data=2, fsdp=2, tensor=2))
  )
  rules = config_lib.base_config().mesh.rules
  kw = dict(slots=4, prefill_rows=4, temperature=1.0, top_k=5)
  engine = _engine(cfg, mesh=mesh, rules=rules, **kw)
  assert engine._vocab_split(512) == ("data", ("fsdp", "tensor"))
  server = E.SlotServer(engine, sharding.shard_params(params, mesh, rules))
  table = server.params["embedder"]["input_embedding"]
  assert tuple(table.sharding.spec) in (
      (("fsdp", "tensor"),), (("fsdp", "tensor"), None)
  )  # fmt: skip
  results = server.run(_requests(seed=3))
  kw.pop("prefill_rows")
  ref = E.SlotServer(_engine(cfg, **kw), params).run(_requests(seed=3))
  ref = {r.request.key: r for r in ref}
  for res in results:
    np.testing.assert_array_equal(res.tokens, ref[res.request.key].tokens)
    np.testing.assert_allclose(
        res.logprobs, ref[res.request.key].logprobs, atol=1e-5
    )


@pytest.mark.parametrize("early", [True, False])
def test_generate_returns_as_soon_as_a_row_ends_when_asked(ring, early):
  """Two slots, three decode steps a call: the 2-token request ends after
  one step; with `early` the call returns then (its slot is refilled at
  once), else it runs on for the call's three steps. Either way each
  request samples what it samples alone, and the row-steps add up."""
  cfg, params = ring
  engine = _engine(cfg, temperature=1.0)
  server = E.SlotServer(engine, params)
  short, long, late = _requests(PROMPTS[:3], [2, 8, 3], seed=5)
  server.submit(short)
  server.submit(long)
  (first,) = server.step(early=early)
  assert first.request.key == short.key
  assert server.clock == engine.cache_length + (1 if early else 3)
  assert server.decode_row_steps == 2 + engine.slots * (1 if early else 3)
  results = [first] + server.run([late], early=early)
  assert sorted(r.request.key for r in results) == [0, 1, 2]
  for res in results:
    tokens, logprobs = _alone(cfg, params, res.request, 1.0)
    np.testing.assert_array_equal(res.tokens, tokens)
    np.testing.assert_allclose(res.logprobs, logprobs, atol=1e-5)
  steps = server.decode_row_steps - server.prefill_calls
  assert steps == engine.slots * (server.clock - engine.cache_length)
