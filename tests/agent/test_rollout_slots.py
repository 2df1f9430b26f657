"""The rollout through the slot engine plays what the lock-step sampler
plays."""

import jax
import pytest

from configs import tiny
from spade.agent import rollout
from spade.environments import library
from spade.environments import runtime
from spade.model import transformer
from spade.selfplay import engine as engine_lib


class SeedExecutor:
  """A trusted seed program run in this process (no sandbox needed)."""

  def __init__(self):
    self.envs = {}

  def reset(self, items):
    out = []
    for eid, source, seed, want_hint in items:
      env = runtime.instantiate(runtime.load_program(source, "<seed>"))
      obs, _ = env.reset(seed=seed)
      self.envs[eid] = env
      hint = str(env.hint()) if want_hint else None
      out.append({"ok": True, "obs": obs, "hint": hint})
    return out

  def step(self, items):
    out = []
    for eid, action in items:
      obs, reward, terminated, truncated, _ = self.envs[eid].step(action)
      out.append(
          {
              "ok": True,
              "obs": obs,
              "reward": float(reward),
              "terminated": bool(terminated),
              "truncated": bool(truncated),
              "info": {},
          }
      )
    return out

  def call(self, items):
    raise AssertionError(f"a game has no tools: {items}")

  def close(self, ids):
    for i in ids:
      self.envs.pop(i, None)


class FakeServer:
  """A `TurnServer` whose reply to a prompt takes `rounds(key, turn)`
  rounds; the reply plays +1 when the prompt shows the hint."""

  def __init__(self, rounds):
    self.rounds = rounds
    self.queue = []  # [key, turn, prompt, rounds left]
    self.log = []  # (round, event, key, turn)
    self.round = 0
    self.decode_row_steps = self.tokens_generated = 0

  @property
  def busy(self):
    return bool(self.queue)

  def submit(self, key, prompt, seed, turn):
    del seed
    self.log.append((self.round, "submit", key, turn))
    self.queue.append([key, turn, prompt, self.rounds(key, turn)])

  def step(self):
    self.round += 1
    self.decode_row_steps += 4
    out, left = [], []
    for item in self.queue:
      item[3] -= 1
      if item[3] > 0:
        left.append(item)
        continue
      key, turn, prompt, _ = item
      text = "".join(chr(i) for i in prompt)
      action = "\\boxed{+1}" if "always +1" in text else "\\boxed{wait}"
      self.tokens_generated += 3
      self.log.append((self.round, "end", key, turn))
      out.append((key, [1, 2, 3], [-0.5] * 3, action))
    self.queue = left
    return out


def test_an_episode_does_not_wait_for_another_episodes_long_reply():
  from tests.agent import test_rollout as batched  # pylint: disable=g-import-not-at-top

  specs = [
      rollout.EpisodeSpec(0, "src", s, hint, s)
      for s in (0, 1)
      for hint in (None, rollout.ENV_HINT)
  ]
  # Episode 0's replies take 9 rounds, the others' one.
  server = FakeServer(lambda key, turn: 9 if key == 0 else 1)
  episodes, stats = rollout.run_episodes(
      specs, server, batched.FakeExecutor(), batched.render, max_turns=6,
      max_context=10_000, seed=0,
  )  # fmt: skip
  want, _ = rollout.run_episodes(
      specs, batched.hinted_sampler, batched.FakeExecutor(),
      batched.render, max_turns=6, max_context=10_000, seed=0,
  )  # fmt: skip
  # The same episodes as a batched sampler: hints, turn limits, returns.
  for a, b in zip(want, episodes):
    assert [t.observation for t in a.turns] == [t.observation for t in b.turns]
    assert a.episode_return() == b.episode_return() and a.hint == b.hint
    assert (a.terminated, a.truncated) == (b.terminated, b.truncated)
  by = {(e.sample, e.hinted): e for e in episodes}
  assert by[1, True].won and len(by[1, True].turns) == 4
  assert not by[0, False].won and len(by[0, False].turns) == 6
  # Episode 1 (hinted, reach 3) played all its 3 turns while episode 0's
  # first reply was still decoding (rounds 1-9): nobody waited.
  ends = {(k, t): r for r, e, k, t in server.log if e == "end"}
  assert by[0, True].won and len(by[0, True].turns) == 3
  assert ends[1, 2] < ends[0, 0] == 9
  # A reply ending in round r is stepped during round r + 1 (or at once
  # when nothing else decodes) and its next turn queued after it: a fixed
  # order, the same on every process.
  submits = {(k, t): r for r, e, k, t in server.log if e == "submit"}
  for (k, t), r in ends.items():
    if (k, t + 1) in submits:
      assert submits[k, t + 1] in (r, r + 1), (k, t)
  assert stats.decode_row_steps == server.decode_row_steps > 0
  assert stats.tokens_generated == stats.tokens_sampled


@pytest.fixture(scope="module")
def engine():
  config = tiny.get_config("smoke")
  config.sampling.slots = 8
  config.sampling.prefill_rows = 8
  config.sampling.decode_steps = 8
  config.sampling.prefill_chunk = 128
  return engine_lib.Engine(config)


def _lockstep(engine, **kw):
  """The agent's lock-step sampler as a batched `TokenSampler`: the
  oracle the slot engine's episodes are compared with."""

  def sample(prompts, seed, keys=None):
    del keys
    out = engine.generator.sample(
        engine.state.params,
        prompts,
        role=transformer.Role.AGENT,
        rng=jax.random.PRNGKey(seed),
        **kw,
    )
    return [(o.token_ids, o.logprobs, o.text) for o in out]

  return sample


def _play(engine, sampler, specs):
  return rollout.run_episodes(
      specs,
      sampler,
      SeedExecutor(),
      engine.render,
      max_turns=3,
      max_context=engine.prompt_budget("agent"),
      seed=5,
      extend=engine.extend,
      stop_ids=tuple(engine.tokenizer.stop_ids),
      # The random model never emits EOS: step every reply, so the
      # episodes go on for several turns.
      unfinished_reply="step",
  )


@pytest.mark.slow
def test_an_episode_through_the_slots_sees_what_lockstep_sees(engine):
  source = library.get_program("mastermind").source
  specs = [
      rollout.EpisodeSpec(0, source, seed, hint, seed)
      for seed in (0, 1, 2)
      for hint in (None, rollout.ENV_HINT)
  ]
  kw = dict(max_new_tokens=12, temperature=0.0)
  lock, lock_stats = _play(engine, _lockstep(engine, **kw), specs)
  before = engine.prefill_counts()
  server = engine.agent_server(**kw)
  slot, slot_stats = _play(engine, server, specs)
  prompt, saved, carried = (
      b - a for a, b in zip(before, engine.prefill_counts())
  )
  assert len(slot) == len(lock) == len(specs)
  for a, b in zip(lock, slot):
    assert a.first_observation == b.first_observation
    assert a.hint == b.hint
    assert [t.observation for t in a.turns] == [t.observation for t in b.turns]
    assert [t.action for t in a.turns] == [t.action for t in b.turns]
    assert [t.completion_ids for t in a.turns] == [
        t.completion_ids for t in b.turns
    ]
    assert a.episode_return() == b.episode_return()
    assert (a.terminated, a.truncated) == (b.terminated, b.truncated)
    # The update's rows: the same exact token sequence and mask.
    assert a.exact and b.exact
    assert a.tokens == b.tokens and a.token_mask == b.token_mask
    assert a.token_logprobs == pytest.approx(b.token_logprobs, abs=1e-4)
  assert sum(len(e.turns) for e in slot) > len(specs)  # multi-turn
  # Both ways count what they decoded; every token generated is sampled.
  made = sum(len(t.completion_ids) for e in slot for t in e.turns)
  for stats in (lock_stats, slot_stats):
    assert stats.tokens_generated == stats.tokens_sampled == made
    assert stats.decode_row_steps >= stats.tokens_generated
    assert stats.padding_ratio >= 1.0
  # Episodes after the first turn continued their slot's cache.
  assert server.server.requests_carried > 0
  assert slot_stats.decode_row_steps == server.decode_row_steps
  # The engine's counts (the `tokens/*` metrics) saw the server's prompts:
  # every turn's whole prompt, of which the histories were carried.
  assert prompt == sum(len(t.prompt(e)) for e in slot for t in e.turns)
  assert prompt > saved >= carried == server.server.tokens_carried > 0


@pytest.mark.slow
def test_design_prompts_through_the_slots_sample_what_lockstep_samples(
    engine,
):
  prompts = [engine.tokenizer.encode(f"prompt {i}", add_bos=True)
             for i in range(3)]  # fmt: skip
  kw = dict(role="designer", max_new_tokens=10, temperature=0.0, seed=3)
  before = engine.prefill_counts()[0]
  slot = engine.sample(prompts, **kw)
  assert engine.prefill_counts()[0] - before == sum(map(len, prompts))
  lock = engine.generator.sample(
      engine.state.params,
      prompts,
      role=transformer.Role.DESIGNER,
      max_new_tokens=10,
      temperature=0.0,
      rng=jax.random.PRNGKey(3),
  )
  assert [o[0] for o in slot] == [o.token_ids for o in lock]
  assert [o[2] for o in slot] == [o.text for o in lock]
