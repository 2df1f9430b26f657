"""The compiled sampler and the text front end, on the tiny model.

The model has two sliding layers (window 4) and one global layer; prompts of up
to 7 tokens plus 8 new tokens make every ring buffer wrap.
"""

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from spade import config as config_lib
from spade.model import sharding
from spade.model import transformer as T
from spade.sampling import sampler as S
from spade.sampling import text

PAD, BOS, EOS = 256, 257, 258
ROWS = [[BOS, 5, 6, 7, 8, 9, 10], [BOS, 100], [BOS, 3, 4, 5], [BOS]]
NEW = 8


def _cfg():
  cfg = config_lib.base_config().model
  cfg.num_layers = 3
  cfg.sliding_window = 4
  cfg.global_every = 3
  return cfg


@pytest.fixture(scope="module")
def setup():
  cfg = _cfg()
  params = T.init_params(cfg, jax.random.key(0))
  sampler = S.Sampler(*T.sampling_fns(cfg, T.Role.AGENT), pad_id=PAD)
  model = T.build_model(cfg)

  @jax.jit
  def log_probs(params, tokens):
    pos = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    logits = model.apply({"params": params}, tokens, pos, T.Role.AGENT)[0]
    return jax.nn.log_softmax(logits)

  return cfg, params, sampler, log_probs


def _teacher_forced(log_probs, params, prompt, generated):
  """log_softmax of the full forward at each generated token (one row)."""
  seq = list(prompt) + list(generated)
  # Pad to a fixed width so the jitted forward compiles once.
  width = 16
  lp = np.asarray(
      log_probs(params, jnp.array([seq + [PAD] * (width - len(seq))]))
  )
  steps = lp[0, len(prompt) - 1 : len(seq) - 1]
  return steps, np.take_along_axis(steps, np.array(generated)[:, None], 1)[:, 0]


def _run(sampler, params, **kw):
  prompts, lengths = S.left_pad(ROWS, 8, PAD)
  kw.setdefault("rng", jax.random.key(7))
  return sampler(params, prompts, lengths, max_new_tokens=NEW, **kw)


def test_greedy_equals_argmax_of_full_forwards(setup):
  _, params, sampler, log_probs = setup
  out = _run(sampler, params, temperature=0.0)
  np.testing.assert_array_equal(out.lengths, [NEW] * 4)
  assert not out.finished.any()
  for i, prompt in enumerate(ROWS):
    seq = list(prompt)
    for j in range(NEW):
      steps, _ = _teacher_forced(log_probs, params, seq, [0])
      seq.append(int(np.argmax(steps[0])))
    assert out.tokens[i].tolist() == seq[len(prompt) :], i


def test_sampled_logprobs_equal_teacher_forced_log_softmax(setup):
  _, params, sampler, log_probs = setup
  for kw in (dict(temperature=1.0), dict(temperature=0.7, top_k=5)):
    out = _run(sampler, params, **kw)
    for i, prompt in enumerate(ROWS):
      _, ref = _teacher_forced(log_probs, params, prompt, out.tokens[i])
      np.testing.assert_allclose(out.logprobs[i], ref, atol=1e-4)


def test_same_key_same_samples_other_key_other_samples(setup):
  _, params, sampler, _ = setup
  a = _run(sampler, params, temperature=1.0, rng=jax.random.key(3))
  b = _run(sampler, params, temperature=1.0, rng=jax.random.key(3))
  c = _run(sampler, params, temperature=1.0, rng=jax.random.key(4))
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_array_equal(a.logprobs, b.logprobs)
  assert not np.array_equal(a.tokens, c.tokens)


def test_greedy_draw_is_numpy_argmax_with_ties_and_masks():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(6, 1000)).astype(np.float32)
  logits[1, [3, 700]] = 9.0  # a tie: the first index wins, as in argmax
  logits[2, :500] = -np.inf
  logits[3] = 0.0  # all equal
  logits[4, -1] = 50.0
  tok, logp = S.sample_logits(
      jax.random.key(0), jnp.asarray(logits), greedy=True, top_k=0,
      use_top_p=False, temperature=jnp.float32(1.0), top_p=jnp.float32(1.0),
  )  # fmt: skip
  np.testing.assert_array_equal(np.asarray(tok), np.argmax(logits, -1))
  peak = logits.max(-1, keepdims=True)
  lse = peak[:, 0] + np.log(np.exp(logits - peak).sum(-1))
  np.testing.assert_allclose(np.asarray(logp), peak[:, 0] - lse, atol=1e-5)


@pytest.mark.parametrize(
    "greedy,top_k,use_top_p",
    [(True, 0, False), (False, 20, False), (False, 20, True),
     (False, 0, False), (False, 0, True)],
)  # fmt: skip
def test_each_draw_s_log_prob_and_token_without_the_extra_passes(
    greedy, top_k, use_top_p
):
  # The sampler reuses the max it has (greedy's, top-k's first value) and
  # top-k's values for the chosen logit: the log-prob must still be the
  # chosen token's log_softmax, and the draw the one a fresh max gives.
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(5, 3000)).astype(np.float32) * 3
  logits[1, :1500] = -np.inf
  logits[2, [5, 2900]] = 30.0  # a tie at the top
  logits = jnp.asarray(logits)
  key = jax.random.key(7)
  temperature, top_p = jnp.float32(0.7), jnp.float32(0.9)
  tok, logp = jax.jit(
      functools.partial(
          S.sample_logits, greedy=greedy, top_k=top_k, use_top_p=use_top_p
      )
  )(key, logits, temperature=temperature, top_p=top_p)
  want = np.take_along_axis(
      np.asarray(jax.nn.log_softmax(logits, -1)), np.asarray(tok)[:, None], 1
  )[:, 0]
  np.testing.assert_allclose(np.asarray(logp), want, rtol=1e-6, atol=1e-6)
  assert np.all(np.isfinite(np.asarray(logp)))
  if greedy:
    np.testing.assert_array_equal(np.asarray(tok), np.argmax(logits, -1))
    return
  if top_k:
    vals, idx = jax.lax.top_k(logits, top_k)
    scaled = vals / temperature
    if use_top_p:
      scaled = jnp.where(S._nucleus(scaled, top_p), scaled, -jnp.inf)
    old = jnp.take_along_axis(idx, S._categorical(key, scaled)[:, None], 1)
    old = old[:, 0]
  else:
    scaled = logits / temperature
    if use_top_p:
      threshold = S._nucleus_threshold(scaled, top_p)
      scaled = jnp.where(scaled >= threshold, scaled, -jnp.inf)
    old = S._categorical(key, scaled)
  np.testing.assert_array_equal(np.asarray(tok), np.asarray(old))


@pytest.mark.parametrize(
    "rows,v,k",
    [(8, 3000, 20), (8, 4096, 1), (16, 1000, 50), (8, 300, 20), (7, 3000, 20)],
)
def test_exact_top_k_is_lax_top_k_ties_included(rows, v, k):
  # Values from a handful of levels tie everywhere, across blocks and at the
  # k-th place; rows of -inf, of one value, and a row ending mid-block. Rows
  # in eights take the maxima tile by tile; 7 rows by a window reduction.
  rng = np.random.default_rng(v + k)
  x = rng.integers(0, 6, size=(rows, v)).astype(np.float32)
  x[1] = -np.inf
  x[2] = 3.0
  x[3, : v // 2] = -np.inf
  x[4] = rng.normal(size=v)
  x[5, -1] = 100.0  # the top in the padded last block
  x[6, rng.integers(0, v, 3 * k)] = 7.0  # more than k tied at the top
  want = jax.lax.top_k(jnp.asarray(x), k)
  got = jax.jit(S.exact_top_k, static_argnums=1)(jnp.asarray(x), k)
  np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
  np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))
  assert got[1].dtype == jnp.int32


@pytest.mark.parametrize(
    "greedy,top_k,use_top_p",
    [(True, 0, False), (False, 20, False), (False, 20, True)],
)
def test_a_draw_split_over_the_vocabulary_is_the_whole_row_s(
    greedy, top_k, use_top_p
):
  # Each of 4 shards (fsdp x tensor) holds 1,024 of 4,096 words, rows over
  # data: the same tokens as the whole rows give, ties across shards going
  # to the lower index, and the same log-probabilities up to the sum's order.
  mesh = sharding.make_mesh(
      ml_collections.ConfigDict(dict(data=2, fsdp=2, tensor=2))
  )
  rng = np.random.default_rng(2)
  logits = rng.normal(size=(6, 4096)).astype(np.float32) * 2
  logits[0, [3000, 5, 2100]] = 40.0  # the top tied in three shards
  logits[1, :2048] = -np.inf  # two shards with nothing
  logits[2, 1000:1040] = 9.0  # top-k's boundary tied across two shards
  logits[3, :3072] = 0.0  # three shards of zeros
  logits = jnp.asarray(logits)
  keys = jax.random.split(jax.random.key(5), 6)
  kw = dict(
      greedy=greedy, top_k=top_k, use_top_p=use_top_p,
      temperature=jnp.float32(0.8), top_p=jnp.float32(0.7),
  )  # fmt: skip
  axes = ("fsdp", "tensor")
  P = jax.sharding.PartitionSpec

  def one(k, row):
    tok, logp = S.sample_logits(k, row[None], **kw)
    return tok[0], logp[0]

  split = jax.jit(
      jax.shard_map(
          functools.partial(S.sample_split, axes=axes, **kw),
          mesh=mesh,
          in_specs=(P("data"), P("data", axes)),
          out_specs=(P("data"), P("data")),
          check_vma=False,
      )
  )
  tok, logp = split(keys, logits)
  want_tok, want_logp = jax.jit(jax.vmap(one))(keys, logits)
  np.testing.assert_array_equal(np.asarray(tok), np.asarray(want_tok))
  np.testing.assert_allclose(
      np.asarray(logp), np.asarray(want_logp), rtol=1e-6, atol=1e-6
  )
  if greedy:
    assert int(tok[0]) == 5 and int(tok[1]) == int(np.argmax(logits[1]))
  # The draws are not all in one shard: the test splits something.
  assert len(set(np.asarray(tok) // 1024)) > 1


def test_a_split_draw_refuses_a_top_k_past_its_shard():
  with pytest.raises(ValueError, match="top_k=0"):
    S.sample_split(
        jax.random.split(jax.random.key(0), 1), jnp.zeros((1, 8)), axes="x",
        greedy=False, top_k=0, use_top_p=False, temperature=jnp.float32(1.0),
        top_p=jnp.float32(1.0),
    )  # fmt: skip


def test_top_k_one_and_tiny_top_p_are_greedy(setup):
  _, params, sampler, _ = setup
  greedy = _run(sampler, params, temperature=0.0)
  top1 = _run(sampler, params, temperature=1.0, top_k=1)
  nucleus = _run(sampler, params, temperature=1.0, top_p=1e-6)
  np.testing.assert_array_equal(top1.tokens, greedy.tokens)
  np.testing.assert_array_equal(nucleus.tokens, greedy.tokens)
  np.testing.assert_allclose(top1.logprobs, greedy.logprobs, atol=1e-6)


def test_top_k_restricts_to_the_k_most_likely(setup):
  _, params, sampler, log_probs = setup
  # A high temperature flattens the distribution; top-k still bounds it.
  out = _run(sampler, params, temperature=50.0, top_k=5)
  for i, prompt in enumerate(ROWS):
    steps, _ = _teacher_forced(log_probs, params, prompt, out.tokens[i])
    top = np.argsort(-steps, -1)[:, :5]
    assert all(t in top[j] for j, t in enumerate(out.tokens[i]))


def test_stop_tokens_and_row_limits(setup):
  cfg, params, sampler, _ = setup
  greedy = _run(sampler, params, temperature=0.0)
  stop = int(greedy.tokens[0, 2])
  first = [
      next((j for j, t in enumerate(r) if t in (stop, EOS)), NEW)
      for r in greedy.tokens.tolist()
  ]
  stopping = S.Sampler(
      sampler.tokens_to_logits, sampler.init_cache, sampler.prepare_params,
      pad_id=PAD,
      stop_ids=(stop, EOS),
  )  # fmt: skip
  out = _run(
      stopping, params, temperature=0.0,
      row_max_new_tokens=np.array([NEW, NEW, 2, NEW]),
  )  # fmt: skip
  for i in range(4):
    limit = 2 if i == 2 else NEW
    expected = min(first[i] + 1, limit)
    assert out.lengths[i] == expected, i
    assert out.finished[i] == (first[i] + 1 <= limit), i
    np.testing.assert_array_equal(
        out.tokens[i, :expected], greedy.tokens[i, :expected]
    )
    assert (out.tokens[i, expected:] == PAD).all()
    assert (out.logprobs[i, expected:] == 0).all()
  assert out.tokens[0, first[0]] in (stop, EOS) and out.finished[0]
  del cfg


def test_ragged_prompt_lists_are_left_padded_to_a_bucket(setup):
  _, params, sampler, _ = setup
  ref = _run(sampler, params, temperature=0.0)
  out = sampler(
      params, ROWS, max_new_tokens=NEW, rng=jax.random.key(0), temperature=0
  )
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  assert S.bucket(5) == 8 and S.bucket(9) == 16 and S.bucket(3, 1) == 4
  with pytest.raises(ValueError, match="truncate it first"):
    S.left_pad([[1] * 9], 8, PAD)


def test_categorical_draw_follows_the_distribution():
  """Two-stage inverse-CDF draw over 600 logits (crosses a 512 block)."""
  logits = (
      jnp.full((600,), -jnp.inf)
      .at[jnp.array([3, 511, 512, 599])]
      .set(jnp.log(jnp.array([0.1, 0.2, 0.3, 0.4])))
  )
  draws = S._categorical(
      jax.random.key(0), jnp.broadcast_to(logits, (20_000, 600))
  )
  counts = np.bincount(np.asarray(draws), minlength=600)
  assert counts.sum() == 20_000
  np.testing.assert_allclose(
      counts[[3, 511, 512, 599]] / 20_000, [0.1, 0.2, 0.3, 0.4], atol=0.015
  )


def test_sharded_sampler_matches_single_device(setup):
  cfg, params, sampler, _ = setup
  mesh_cfg = ml_collections.ConfigDict(dict(data=2, fsdp=2, tensor=2))
  mesh = sharding.make_mesh(mesh_cfg)
  rules = config_lib.base_config().mesh.rules
  sharded = S.Sampler(
      *T.sampling_fns(cfg, T.Role.AGENT), pad_id=PAD, mesh=mesh, rules=rules
  )
  placed = sharding.shard_params(params, mesh, rules)
  ref = _run(sampler, params, temperature=1.0)
  out = _run(sharded, placed, temperature=1.0)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-5)


class _Bytes:
  """A minimal byte tokenizer (the contract's ids) for the text tests."""

  pad_id, bos_id, eos_id = PAD, BOS, EOS
  stop_ids = (EOS,)

  def encode(self, s, *, add_bos=False):
    return ([BOS] if add_bos else []) + list(s.encode("utf-8"))

  def decode(self, ids):
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def test_text_generate_returns_consistent_completions(setup):
  cfg, params, sampler, _ = setup
  gen = text.TextGenerator(cfg, _Bytes())
  prompts = ["abc", "hello", "x" * 6]
  outs = gen.generate(
      params, prompts, role=T.Role.AGENT, max_new_tokens=NEW,
      temperature=0.0, rng=jax.random.key(0),
  )  # fmt: skip
  assert len(outs) == 3
  assert outs[2].prompt_ids == [BOS] + [ord("x")] * 6
  assert outs[0].prompt_ids == [BOS] + list(b"abc")
  ref = sampler(
      params, [o.prompt_ids for o in outs] + [[PAD]], max_new_tokens=NEW,
      rng=jax.random.key(0), temperature=0.0,
  )  # fmt: skip
  for i, o in enumerate(outs):
    n = int(ref.lengths[i])
    assert o.token_ids == ref.tokens[i, :n].tolist()
    np.testing.assert_allclose(o.logprobs, ref.logprobs[i, :n], atol=1e-6)
    body = [t for t in o.token_ids if t != EOS]
    assert o.text == _Bytes().decode(body)
    assert o.finished == (EOS in o.token_ids)
  # The front end never cuts a prompt: one that leaves no room for the reply
  # is an error (callers cut chat histories by whole turns first).
  room = cfg.max_len - NEW
  with pytest.raises(ValueError, match="truncate_messages"):
    gen.generate(
        params, ["y" * room], role=T.Role.AGENT, max_new_tokens=NEW,
        temperature=0.0, rng=jax.random.key(0),
    )  # fmt: skip
  # A fixed `rows` keeps one batch shape whatever the number of prompts.
  (one,) = gen.sample(
      params, [outs[0].prompt_ids], role=T.Role.AGENT, max_new_tokens=NEW,
      temperature=0.0, rng=jax.random.key(0), rows=4,
  )  # fmt: skip
  assert one.token_ids == outs[0].token_ids


@pytest.mark.parametrize("chunk", [3, 4])
def test_chunked_prefill_samples_what_one_prefill_samples(setup, chunk):
  """Prompts written `chunk` columns at a time (a first partial chunk when 8
  is not a multiple, then the loop) give the same tokens and log-probs."""
  _, params, sampler, _ = setup
  whole = S.Sampler(*T.sampling_fns(_cfg(), T.Role.AGENT), pad_id=PAD,
                    prefill_chunk=0)  # fmt: skip
  chunked = S.Sampler(*T.sampling_fns(_cfg(), T.Role.AGENT), pad_id=PAD,
                      prefill_chunk=chunk)  # fmt: skip
  for temperature in (0.0, 1.0):
    ref = _run(whole, params, temperature=temperature)
    out = _run(chunked, params, temperature=temperature)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("scan_decode", [False, True])
def test_shared_prefix_samples_what_the_unshared_batch_samples(scan_decode):
  """Rows that start alike: their common prefix (9 tokens, shared as 8 with
  share_prefix=4) is prefilled once and copied to every row; tokens and
  log-probs are those of the batch prefilled row by row, greedy and sampled,
  per-layer and scanned caches, on a model whose layers are all global."""
  cfg = _cfg()
  cfg.update(scan_decode=scan_decode, sliding_window=0)
  params = T.init_params(cfg, jax.random.key(0))
  common = [BOS, 11, 12, 13, 14, 15, 16, 17, 18]
  rows = [common + [5, 6, 7], common + [100], common + [3, 4, 5, 9, 9], common]
  fns = T.sampling_fns(cfg, T.Role.AGENT)
  assert fns.share_prefix == 64
  plain = S.Sampler(*fns._replace(share_prefix=0), pad_id=PAD)
  shared = S.Sampler(*fns._replace(share_prefix=4), pad_id=PAD, prefill_chunk=3)
  for temperature in (0.0, 1.0):
    kw = dict(
        max_new_tokens=NEW, rng=jax.random.key(3), temperature=temperature
    )
    ref = plain(params, rows, **kw)
    out = shared(params, rows, **kw)
    assert (ref.shared_prefix, out.shared_prefix) == (0, 8)
    assert out.prefill_tokens_saved == 3 * 8  # the prefix, once for 4 rows
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.lengths, ref.lengths)
    np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-5)
  # Nothing in common beyond BOS: nothing is shared.
  assert shared(params, ROWS, **kw).shared_prefix == 0


def test_sliding_window_models_do_not_share_prefixes():
  # Left padding after a shared prefix would evict ring-buffer keys.
  assert T.sampling_fns(_cfg(), T.Role.AGENT).share_prefix == 0


def test_identical_prompts_are_prefilled_once(setup):
  """The K episodes of one arm start from one prompt: the distinct prompts
  are prefilled once each (ring buffers wrapping) and every copy samples
  what it samples when each row is prefilled on its own."""
  _, params, sampler, _ = setup
  a, b, c = ROWS[0], ROWS[2], ROWS[1]
  rows = [a, b, a, a, c, b, a, a]
  plain = S.Sampler(*T.sampling_fns(_cfg(), T.Role.AGENT), pad_id=PAD,
                    share_rows=False)  # fmt: skip
  for temperature in (0.0, 1.0):
    kw = dict(
        max_new_tokens=NEW, rng=jax.random.key(5), temperature=temperature
    )
    ref = plain(params, rows, **kw)
    out = sampler(params, rows, **kw)
    assert (ref.prefilled_rows, out.prefilled_rows) == (8, 4)  # 3, padded
    assert out.prefill_tokens_saved == 4 * 8 and ref.prefill_tokens_saved == 0
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.lengths, ref.lengths)
    np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-5)
  if temperature:  # copies of one prompt still draw their own samples
    assert len({tuple(out.tokens[i]) for i in (0, 2, 3, 6, 7)}) > 1
  # Distinct prompts: nothing to share, every row is prefilled.
  assert _run(sampler, params, temperature=0.0).prefilled_rows == 4


@pytest.mark.slow
def test_sharing_under_a_mesh_samples_what_one_device_samples():
  """A shared prefix (a row per batch shard) and repeated prompts on a
  2x2x2 mesh give the single-device, unshared tokens and log-probs."""
  cfg = _cfg()
  cfg.sliding_window = 0
  params = T.init_params(cfg, jax.random.key(1))
  common = [BOS] + list(range(20, 28))
  rows = [common + [5, 6], common + [100]] * 4
  fns = T.sampling_fns(cfg, T.Role.AGENT)
  plain = S.Sampler(*fns._replace(share_prefix=0), pad_id=PAD,
                    share_rows=False)  # fmt: skip
  mesh = sharding.make_mesh(
      ml_collections.ConfigDict(dict(data=2, fsdp=2, tensor=2))
  )
  rules = config_lib.base_config().mesh.rules
  shared = S.Sampler(*fns._replace(share_prefix=4), pad_id=PAD, mesh=mesh,
                     rules=rules)  # fmt: skip
  placed = sharding.shard_params(params, mesh, rules)
  kw = dict(max_new_tokens=NEW, rng=jax.random.key(2), temperature=1.0)
  ref = plain(params, rows, **kw)
  out = shared(placed, rows, **kw)
  assert (out.shared_prefix, out.prefilled_rows) == (8, 4)
  # The prefix once per shard (4 of 8 rows), the suffixes of 4 distinct rows.
  assert out.prefill_tokens_saved == 4 * 8 + 4 * out.prefill_length
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-5)


def _global_cfg(**overrides):
  cfg = _cfg()
  cfg.update(sliding_window=0, **overrides)
  return cfg


@pytest.mark.slow
@pytest.mark.parametrize("scan_decode", [False, True])
def test_a_carried_cache_samples_what_a_whole_prefill_samples(scan_decode):
  """Turn 2 of three rows continues turn 1's cache (rows reordered, one
  row fresh, turn 1 with a shared prefix and identical rows, rows stopping
  at different steps): tokens and log-probs are those of prefilling each
  row's whole history, greedy and sampled; only the new tokens are
  prefilled."""
  cfg = _global_cfg(scan_decode=scan_decode)
  params = T.init_params(cfg, jax.random.key(0))
  fns = T.sampling_fns(cfg, T.Role.AGENT)
  sampler = S.Sampler(
      *fns._replace(share_prefix=4), pad_id=PAD, stop_ids=(EOS, 40, 41),
      prefill_chunk=3,
  )  # fmt: skip
  assert sampler.can_continue
  common = [BOS, 11, 12, 13, 14, 15, 16, 17, 18]
  a, b = common + [5, 6, 7], common + [100]
  first = [a, b, a, a, common, a, b, a]
  for temperature in (0.0, 1.0):
    kw = dict(max_new_tokens=NEW, temperature=temperature)
    one = sampler(params, first, rng=jax.random.key(1), keep_cache=True, **kw)
    assert one.shared_prefix == 8 and one.prefilled_rows == 4
    held = [
        first[r] + one.tokens[r, : one.lengths[r] - 1].tolist()
        for r in range(8)
    ]
    for r in range(8):
      assert len(one.slots[r]) == len(held[r])
    # Turn 2: rows 2, 0 and 4 of turn 1 (the last token sampled, then an
    # "observation" of a few tokens), and a fresh prompt.
    order = [2, 0, 4, -1]
    extra = [[60, 61], [62], [63, 64, 65, 66, 67], [BOS, 70, 71]]
    whole, rest = [], []
    for r, e in zip(order, extra):
      if r < 0:
        whole.append(e)
        rest.append(e)
        continue
      last = [int(one.tokens[r, one.lengths[r] - 1])]
      whole.append(held[r] + last + e)
      rest.append(last + e)
    width = S.bucket(max(len(w) for w in one.slots))
    slots = np.full((4, width), -1, np.int32)
    for i, r in enumerate(order):
      if r >= 0:
        slots[i, : len(one.slots[r])] = one.slots[r]
    carry = S.Carry(one.cache, np.asarray(order, np.int32), slots)
    plain = S.Sampler(*fns._replace(share_prefix=0), pad_id=PAD,
                      stop_ids=(EOS, 40, 41), share_rows=False)  # fmt: skip
    ref = plain(params, whole, rng=jax.random.key(2), **kw)
    out = sampler(params, rest, rng=jax.random.key(2), carry=carry, **kw)
    assert out.prefill_length == S.bucket(max(len(x) for x in rest))
    assert out.prefill_length < ref.prefill_length
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.lengths, ref.lengths)
    np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-5)


def test_a_carry_that_skips_a_token_changes_the_samples():
  """The check above can fail: carrying a row's history minus one token
  (its positions then one off) samples something else."""
  cfg = _global_cfg()
  params = T.init_params(cfg, jax.random.key(0))
  sampler = S.Sampler(*T.sampling_fns(cfg, T.Role.AGENT), pad_id=PAD)
  first = [[BOS, 5, 6, 7, 8, 9, 10, 11]]
  kw = dict(max_new_tokens=NEW, temperature=0.0, rng=jax.random.key(1))
  one = sampler(params, first, keep_cache=True, **kw)
  held = first[0] + one.tokens[0, : one.lengths[0] - 1].tolist()
  whole = held + [int(one.tokens[0, one.lengths[0] - 1]), 60, 61]
  ref = sampler(params, [whole], **kw)
  slots = np.asarray(one.slots[0])[None, 1:]  # the BOS dropped
  bad = S.Carry(one.cache, np.zeros(1, np.int32), slots)
  out = sampler(params, [whole[len(held) :]], carry=bad, **kw)
  assert not np.array_equal(out.logprobs, ref.logprobs)


def test_ring_buffer_models_cannot_continue(setup):
  _, params, sampler, _ = setup
  assert not sampler.can_continue
  carry = S.Carry(None, np.zeros(4, np.int32), np.zeros((4, 1), np.int32))
  with pytest.raises(ValueError, match="sliding windows"):
    _run(sampler, params, carry=carry)


class _Tok:
  pad_id, stop_ids = PAD, (EOS,)

  def decode(self, ids):
    return " ".join(str(i) for i in ids)


@pytest.mark.parametrize("sliding_window", [0, 4])
def test_a_session_continues_each_keys_row(sliding_window):
  """Three turns of four episodes through `TextGenerator.sample` with a
  session (episodes dropping out, keys reordered, odd batch sizes) sample
  what calls without one sample; with sliding windows nothing is carried."""
  cfg = _cfg()
  cfg.update(sliding_window=sliding_window)
  params = T.init_params(cfg, jax.random.key(0))
  gen = text.TextGenerator(cfg, _Tok())
  session = text.Session()
  prompts = {k: [BOS, 20 + k, 30 + k] for k in range(4)}
  live = [0, 1, 2, 3]
  for turn in range(3):
    kw = dict(role=T.Role.AGENT, max_new_tokens=6, temperature=0.0,
              rng=jax.random.key(turn))  # fmt: skip
    batch = [prompts[k] for k in live]
    ref = gen.sample(params, batch, **kw)
    out = gen.sample(params, batch, session=session, keys=live, **kw)
    for a, b in zip(out, ref):
      assert a.token_ids == b.token_ids
      np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    for k, c in zip(live, out):
      prompts[k] = prompts[k] + c.token_ids + [50 + turn, 51]
    live = [k for k in reversed(live) if k != turn]  # one drops out a turn
  if sliding_window:
    assert session.tokens_carried == 0
  else:
    # Turn 2 carries 4 rows' histories, turn 3 three.
    assert session.tokens_carried > 0


def test_nucleus_threshold_without_sorting_equals_the_sorted_one():
  # The sort-free nucleus (bisection over the floats' order) keeps exactly
  # the sorted definition's set, ties, masked logits and one dominant token
  # included; a row per case, one compile per top_p.
  rng = np.random.default_rng(0)
  rows = []
  for scale in (0.1, 1.0, 5.0, 30.0):
    rows.append(rng.normal(size=2048) * scale)
    rows.append(np.round(rng.normal(size=2048) * scale))  # many ties
  masked = rng.normal(size=2048)
  masked[:700] = -np.inf
  dominant = rng.normal(size=2048)
  dominant[5] = 40.0
  rows += [masked, dominant, np.zeros(2048), -np.abs(rng.normal(size=2048))]
  x = jnp.asarray(np.stack(rows).astype(np.float32))
  for top_p in (1e-6, 0.05, 0.5, 0.9, 0.95, 0.999):
    p = jnp.float32(top_p)
    got = np.asarray(jax.jit(S._nucleus_threshold)(x, p))
    want = np.asarray(jax.jit(S.nucleus_threshold_sorted)(x, p))
    np.testing.assert_array_equal(got, want, err_msg=f"top_p={top_p}")
  # Ties at the threshold: three equal logits of about 1/3 each and the rest
  # negligible; top_p=0.5 keeps two of them in sorted order, so their value
  # is the threshold and all three are kept.
  v = np.full(2048, -30.0, np.float32)
  v[[3, 9, 11]] = 0.0
  t = np.asarray(S._nucleus_threshold(jnp.asarray(v[None]), jnp.float32(0.5)))
  assert t[0, 0] == 0.0
