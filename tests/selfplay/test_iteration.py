"""The loop's host logic with a fake policy and executor (no model, no sandbox).

Each test pins a bug the untyped loop had, or a reference default.
"""

import json

import numpy as np
import pytest

from spade import config as config_lib
from spade.agent import episodes as episodes_lib
from spade.agent import rollout
from spade.regret import scoring
from spade.selfplay import batching
from spade.selfplay import design as design_lib
from spade.selfplay import loop
from spade.selfplay import play_phase
from spade.selfplay import records
from spade.selfplay import score as score_lib
from spade.selfplay import state as state_lib
from tests.selfplay import fakes


def _config(**overrides):
  c = config_lib.base_config()
  c.grounding.enabled = False
  c.designer.num_envs = 2
  c.designer.samples_per_prompt = 2
  c.agent.episodes_per_env = 2
  for key, value in overrides.items():
    node = c
    *path, last = key.split(".")
    for p in path:
      node = node[p]
    node[last] = value
  return c


class _Run:
  """A run on the fakes: `loop.iteration` with its state carried along."""

  def __init__(self, config, engine=None):
    self.config = config
    self.engine = engine or fakes.FakeEngine(config)
    self.envs = self.engine  # the fake also validates
    self.state = state_lib.LoopState.create(config)

  def iteration(self, it):
    self.state, m = loop.iteration(
        self.config, self.engine, self.envs, self.state, it
    )
    return m


_trainer = _Run


def _design(t, it=0):
  """The design phase of trainer `t`: (designs, its metrics)."""
  out = design_lib.design(t.config, t.engine, t.envs, t.state, it)
  return out.designs, out.metrics


def _environments(t, it, designs):
  return play_phase.environments(t.config, t.state, it, designs, t.envs).envs


def _score(config, designs, envs, episodes):
  window = records.Window.open(0, envs, designs).with_plays(
      *score_lib.returns(config, envs, episodes),
      score_lib.timed_out(len(envs), episodes),
  )
  scores, _ = score_lib.score(
      config, window, state_lib.LearningPotential(), closes=False
  )
  return scores


def test_a_replayed_program_keeps_the_hint_written_for_it():
  # A valid program without hint(): the model writes its hint. The archive
  # must keep that hint, so replaying the program plays a hinted arm.
  c = _config(
      **{
          "memory.replay_fraction": 1.0,
          "designer.num_envs": 1,
          "designer.samples_per_prompt": 1,
      }
  )
  t = _trainer(c)
  designs, _ = _design(t)
  assert designs and all(d.valid for d in designs)
  written = designs[0].hint
  assert written and "Count to three" in written
  replays = [e for e in _environments(t, 1, []) if e.origin == "replay"]
  assert replays, "nothing was replayed"
  assert all(e.hint == written for e in replays)


def test_designs_are_frozen_records():
  t = _trainer(_config())
  designs, _ = _design(t)
  d = designs[0]
  assert isinstance(d, records.Design) and isinstance(
      d.verdict, records.Verdict
  )
  try:
    d.verdict.valid = False  # type: ignore[misc]
  except AttributeError:
    pass
  else:
    raise AssertionError("a Verdict must be frozen")


def _episode(env, k, hinted, rewards, terminated=True, env_failed=False):
  turns = tuple(
      episodes_lib.Turn((1, 2), (3, 4), (-0.1, -0.2), "a", r, "o")
      for r in rewards
  )
  return episodes_lib.Episode(
      env_index=env,
      sample=k,
      hinted=hinted,
      seed=0,
      hint="h" if hinted else None,
      first_observation="x",
      turns=turns,
      terminated=terminated,
      truncated=not terminated,
      env_failed=env_failed,
  )


def test_failed_environment_episodes_leave_their_group_and_the_update():
  c = _config()
  t = _trainer(c)
  envs = [records.Environment("src", "seed", None)]
  episodes = [
      _episode(0, 0, False, [1.0]),
      _episode(0, 1, False, [0.0], env_failed=True),
      _episode(0, 0, True, [1.0]),
      _episode(0, 1, True, [1.0]),
  ]
  scores = _score(c, [], envs, episodes)
  assert not scores.mask[0, 1, 0] and scores.mask[0, 0, 0]
  # The only unhinted episode left has no one to be compared with: no
  # advantage, no row; the failed one is never a row.
  agent_rows, _ = score_lib.agent_rows(c, episodes, scores)
  assert agent_rows == []


def test_rows_only_where_there_is_signal_and_not_on_hinted_plays():
  c = _config()
  t = _trainer(c)
  envs = [
      records.Environment("a", "seed", None),
      records.Environment("b", "seed", None),
  ]
  episodes = [
      _episode(0, 0, False, [0.0, 1.0]),  # wins in two turns
      _episode(0, 1, False, [0.0], terminated=False),  # truncated: 0
      _episode(0, 0, True, [1.0]),
      _episode(0, 1, True, [1.0]),
      _episode(1, 0, False, [0.0]),  # env 1: all equal, no signal
      _episode(1, 1, False, [0.0]),
      _episode(1, 0, True, [0.0]),
      _episode(1, 1, True, [0.0]),
  ]
  scores = _score(c, [], envs, episodes)
  agent_rows, total = score_lib.agent_rows(c, episodes, scores)
  # Env 0's two unhinted episodes (returns 1 and 0): 3 turns with
  # advantages +-1, z-scored per game as the reference does.
  np.testing.assert_allclose(
      sorted(r.advantage for r in agent_rows), [-1.0, 1.0, 1.0], 1e-6
  )
  assert total == 5  # unhinted turns only
  c.regret.agent_advantage = "center"
  agent_rows, _ = score_lib.agent_rows(
      c, episodes, _score(c, [], envs, episodes)
  )
  assert sorted(r.advantage for r in agent_rows) == [-0.5, 0.5, 0.5]

  c.agent.train_on_hinted = True
  c.regret.agent_advantage = "normalize"
  scores = _score(c, [], envs, episodes)
  agent_rows, total = score_lib.agent_rows(c, episodes, scores)
  assert total == 9 and len(agent_rows) == 5  # env 0, both arms


def _designer_scores(config):
  returns = np.zeros((1, 2, 2), np.float32)
  returns[0, :, 1] = 1.0  # hinted wins, unhinted loses: full regret term
  return scoring.make_scorer(config)(
      returns,
      np.ones_like(returns, bool),
      np.ones((1,), bool),
      np.array([0], np.int32),  # env 0 is design 0
      np.array([True, False]),  # design 1 stayed invalid
      np.array([0, 0], np.int32),  # one skill group
  )


def test_designer_advantages_of_a_group_with_one_invalid_design():
  c = _config()
  valid_reward = 0.4 * 1.0 + 0.6 * 0.0  # the blend: regret term + plateau(0)
  # The reference: a design still invalid after its attempts has no
  # trajectory; the valid one alone in its skill group centres to 0.
  out = _designer_scores(c)
  np.testing.assert_allclose(out["design_reward"], [valid_reward, -1.0])
  np.testing.assert_allclose(out["designer_advantages"], [0.0, 0.0])
  # Ours, penalised and centred: the gap keeps its size.
  c.designer.invalid_designs = "penalize"
  gap = (valid_reward + 1.0) / 2
  np.testing.assert_allclose(
      _designer_scores(c)["designer_advantages"], [gap, -gap], 1e-6
  )
  # Ours before, std-normalised: every difference becomes +-1.
  c.regret.designer_advantage = "normalize"
  np.testing.assert_allclose(
      _designer_scores(c)["designer_advantages"], [1.0, -1.0], 1e-5
  )


class Flaky(fakes.FakeEngine):
  """Invalid twice, then valid."""

  def validate(self, codes):
    self.validated = getattr(self, "validated", 0) + 1
    ok = self.validated >= 3
    return [records.Verdict(ok, "ok" if ok else "smoke") for _ in codes]


def test_an_invalid_design_is_sampled_again_up_to_its_attempt_limit():
  c = _config(**{"designer.num_envs": 1, "designer.samples_per_prompt": 1})
  c.designer.max_attempts = 3
  engine = Flaky(c)
  designs, extra = _design(_trainer(c, engine))
  assert designs[0].valid and designs[0].attempt == 2
  assert extra["designer/attempts_mean"] == 3.0
  c.designer.max_attempts = 1
  designs, _ = _design(_trainer(c, Flaky(c)))
  assert not designs[0].valid and designs[0].verdict.reason == "smoke"


def test_each_attempt_retrieves_its_memory_examples_again(monkeypatch):
  # The reference's corpus orchestrator augments every attempt's prompt
  # with a fresh memory retrieval (`_augment_prompt_with_memory`).
  c = _config(**{"designer.num_envs": 1, "designer.samples_per_prompt": 1})
  c.designer.max_attempts = 3
  assert c.designer.fresh_examples_per_attempt  # the default
  draws = {}
  real = state_lib.LoopState.examples
  for fresh in (True, False):
    c.designer.fresh_examples_per_attempt = fresh
    t = _trainer(c, Flaky(c))
    calls = []

    def examples(self, doc, n, skill, calls=calls):
      calls.append(skill)
      return real(self, doc, n, skill)

    monkeypatch.setattr(state_lib.LoopState, "examples", examples)
    designs, _ = _design(t)
    assert designs[0].valid and designs[0].attempt == 2
    draws[fresh] = len(calls)
  assert draws == {True: 3, False: 1}


def test_fixed_pool_from_a_folder_smaller_than_the_batch(tmp_path):
  for name in ("a.py", "b.py"):
    (tmp_path / name).write_text(fakes.PROGRAM)
  c = _config(**{"train.mode": "fixed_pool", "train.pool_dir": str(tmp_path)})
  c.designer.num_envs = 4
  envs = _environments(_trainer(c), 0, [])
  assert len(envs) == 4
  assert {e.name for e in envs} <= {"a.py", "b.py"}
  assert all(e.origin == "pool" for e in envs)


def test_fixed_pool_of_named_seeds():
  from spade.environments import library  # pylint: disable=g-import-not-at-top
  import pytest  # pylint: disable=g-import-not-at-top

  c = _config(**{"train.mode": "fixed_pool"})
  c.train.pool_seeds = ("order_lookup", "coin_change")
  c.designer.num_envs = 2
  t = _trainer(c)
  envs = _environments(t, 0, [])
  assert sorted(e.name for e in envs) == ["coin_change", "order_lookup"]
  assert all(e.origin == "seed" for e in envs)
  # The pool is the seed library's training programs, never a held-out one.
  held_out = {p.name for p in library.seed_programs() if p.heldout}
  assert not held_out & {e.name for e in envs}
  c.train.pool_seeds = ("order_lookup", "no_such_seed")
  t = _trainer(c)
  with pytest.raises(ValueError, match="no_such_seed"):
    _environments(t, 0, [])


def test_delayed_designer_rows_survive_the_checkpoint():
  c = _config()
  state = state_lib.LoopState.create(c)
  row = batching.Row([1, 2], [3], [-0.5], 0.25)
  # None: a design without signal, kept in its place in the batch's count.
  due, queue = state.delay_designer_rows(0, [row, None], delay=2)
  assert due == [] and state.delayed == ()  # the state itself is unchanged
  state = state.replace(delayed=queue)
  due, queue = state.delay_designer_rows(1, [], delay=2)
  assert due == []
  state = state.replace(delayed=queue)
  # The checkpoint keeps the loop state as JSON; a resume loads it.
  saved = json.loads(json.dumps(state.to_json()))
  resumed = state_lib.LoopState.create(c).restored(saved)
  assert resumed.delay_designer_rows(2, [], delay=2)[0] == [row, None]
  assert state.delay_designer_rows(2, [], delay=2)[0] == [row, None]


def test_exchange_keys_are_deleted_once_every_process_read_them(monkeypatch):
  from spade.selfplay import multihost  # pylint: disable=g-import-not-at-top

  class Store:
    """The coordination service's key-value store, with process 1 ahead."""

    def __init__(self):
      self.kv = {}

    def key_value_set(self, key, value):
      self.kv[key] = value

    def blocking_key_value_get(self, key, timeout_ms):
      del timeout_ms
      if key.endswith("/1"):  # the peer process wrote the same round
        self.kv.setdefault(key, json.dumps("peer"))
      return self.kv[key]

    def key_value_delete(self, key):
      del self.kv[key]

  store = Store()
  monkeypatch.setattr(multihost, "_client", lambda: store)
  monkeypatch.setattr(multihost.jax, "process_count", lambda: 2)
  monkeypatch.setattr(multihost.jax, "process_index", lambda: 0)
  tag = "test-delete"
  for round_ in range(5):
    assert multihost.allgather_objects(round_, tag=tag) == [round_, "peer"]
  mine = [
      k for k in store.kv if k.startswith(f"spade/{tag}/") and k.endswith("/0")
  ]
  # Only the latest round's own key is left; the earlier four were deleted.
  assert mine == [f"spade/{tag}/4/0"]


def test_a_regenerated_pool_is_played_over_its_window_and_scored_from_all_of_it(
    monkeypatch,
):
  c = _config(**{"designer.num_envs": 2, "designer.samples_per_prompt": 2})
  c.designer.regeneration_interval = 2
  c.num_iterations = 8  # no flush at the last iteration here
  c.memory.enabled = False  # the fake's programs are near-duplicates
  t = _trainer(c)
  calls = []

  def play(config, engine, executor, it, envs, hinted_arm=True, skip=()):
    del config, engine, executor, skip
    calls.append((it, [e.source for e in envs], hinted_arm))
    eps = []
    for e in range(len(envs)):
      for k in range(2):
        # Env 0 is won without the hint once in two plays; env 1 never.
        eps.append(
            _episode(e, k, False, [1.0 if e == 0 and k == it % 2 else 0.0])
        )
        if hinted_arm:
          eps.append(_episode(e, k, True, [1.0]))
    return eps, rollout.RolloutStats()

  monkeypatch.setattr(play_phase, "play", play)
  first = t.state
  m0 = t.iteration(0)
  assert t.state.window is not None and m0["designer/window_closed"] == 0.0
  # One way: the iteration returned a new state and left its input as it was.
  assert first.window is None and first.delayed == ()
  assert t.engine.updates[-1][1] == []  # no designer rows before the end
  # The window lives in the loop state: a checkpoint round trip keeps it.
  window = t.state.window
  saved = json.loads(json.dumps(t.state.to_json()))
  t.state = state_lib.LoopState.create(c).restored(saved)
  np.testing.assert_array_equal(t.state.window.returns, window.returns)
  np.testing.assert_array_equal(t.state.window.mask, window.mask)
  assert t.state.window.widths == window.widths
  m1 = t.iteration(1)
  (it0, pool0, hinted0), (it1, pool1, hinted1) = calls
  assert pool0 == pool1 and hinted0 and not hinted1
  assert t.state.window is None and m1["designer/window_closed"] == 1.0
  # The reference's timing (`optim.designer_delay=1`, the default): the
  # closed window's rows train at the next regeneration, with its agent rows.
  assert c.optim.designer_delay == 1
  assert t.engine.updates[-1][1] == []
  t.iteration(2)
  assert calls[-1][2] and calls[-1][1] != pool0  # a new pool, hinted
  designer_rows = t.engine.updates[-1][1]
  # Scored from both iterations' plays: env 0 won 2 of 4 unhinted plays (a
  # plateau win rate) and env 1 none, so their designs differ.
  assert len(designer_rows) == 2
  assert designer_rows[0].advantage > 0 > designer_rows[1].advantage


def test_the_last_iteration_flushes_an_open_window_and_delayed_rows(
    monkeypatch,
):
  # The reference's final rollout trains every buffered designer row.
  c = _config(**{"designer.num_envs": 2, "designer.samples_per_prompt": 2})
  c.designer.regeneration_interval = 4
  c.num_iterations = 1
  c.memory.enabled = False

  def play(config, engine, executor, it, envs, hinted_arm=True, skip=()):
    del config, engine, executor, it, skip
    eps = []
    for e in range(len(envs)):
      for k in range(2):
        eps.append(_episode(e, k, False, [1.0 if e == 0 and k == 0 else 0.0]))
        if hinted_arm:
          eps.append(_episode(e, k, True, [1.0]))
    return eps, rollout.RolloutStats()

  monkeypatch.setattr(play_phase, "play", play)
  assert c.optim.flush_designer_rows  # the default
  trained = {}
  for flush in (True, False):
    c.optim.flush_designer_rows = flush
    t = _trainer(c)
    m = t.iteration(0)
    agent_rows, designer_rows = t.engine.updates[-1]
    # The loss's denominator: every row there was, with or without signal.
    assert t.engine.samples >= len(agent_rows) + len(designer_rows) > 0
    trained[flush] = (len(designer_rows), m["designer/window_closed"])
  assert trained == {True: (2, 1.0), False: (0, 0.0)}
  state = state_lib.LoopState.create(c)
  row = batching.Row([1, 2], [3], [-0.5], 0.25)
  due, queue = state.delay_designer_rows(0, [row], delay=4)
  assert due == []
  state = state.replace(delayed=queue)
  assert state.delay_designer_rows(1, [], delay=4, flush=True)[0] == [row]


def test_the_update_batch_is_shaped_to_the_global_batch(monkeypatch):
  # 2 designs (one window of one iteration) and 2 x 2 unhinted episodes: a
  # batch of 4 keeps the designs and trims the last environment's two
  # episodes; a batch of 10 duplicates the 4 episodes to 8 samples.
  c = _config(**{"designer.num_envs": 2, "designer.samples_per_prompt": 2})
  c.designer.regeneration_interval = 1
  c.optim.designer_delay = 0  # the designs' rows in the same update
  c.memory.enabled = False

  def play(config, engine, executor, it, envs, hinted_arm=True, **kwargs):
    del config, engine, executor, it, kwargs
    eps = []
    for e in range(len(envs)):
      for k in range(2):
        eps.append(_episode(e, k, False, [1.0 if k == 0 else 0.0]))
        if hinted_arm:
          eps.append(_episode(e, k, True, [1.0]))
    return eps, rollout.RolloutStats()

  monkeypatch.setattr(play_phase, "play", play)
  for size, want in (
      (4, dict(trimmed=2, duplicated=0, real=4, copies=[1, 1])),
      (10, dict(trimmed=0, duplicated=4, real=10, copies=[2, 2, 2, 2])),
      (0, dict(trimmed=0, duplicated=0, real=6, copies=[1, 1, 1, 1])),
  ):
    c.optim.global_batch_size = size
    t = _trainer(c)
    m = t.iteration(0)
    agent_rows, _ = t.engine.updates[-1]
    assert [r.copies for r in agent_rows] == want["copies"], size
    assert t.engine.samples == want["real"]
    assert m["update/trimmed_samples"] == want["trimmed"]
    assert m["update/duplicated_samples"] == want["duplicated"]
    assert m["update/real_samples"] == want["real"]
    assert m["train/rows_total"] == 6  # 2 designs and 4 episodes


def test_the_solvability_audit_refuses_what_the_designer_judges_unwinnable():
  from spade.selfplay import design as design_lib

  class Auditor(fakes.FakeEngine):

    def sample(
        self,
        prompts,
        *,
        role,
        max_new_tokens,
        temperature,
        seed,
        top_k=0,
        top_p=1.0,
        progress=None,
    ):
      self.sampled.append((role, len(prompts)))
      return [([1], [-0.1], "No tool sets it. \\boxed{no}") for _ in prompts]

  c = _config()
  c.designer.audit = True
  c.model.max_len = 16384  # room for the reference's prompt, byte tokens
  engine = Auditor(c)
  ok = records.Verdict.from_dict({"valid": True, "reason": "ok"})
  bad = records.Verdict.from_dict({"valid": False, "reason": "step"})
  out, _ = design_lib.solvability_audit(c, engine, 0, 0, ["a", "b"], [ok, bad])
  assert engine.sampled == [("designer", 1)]
  assert (out[0].valid, out[0].reason) == (False, "env_validator")
  assert "No tool sets it" in out[0].message
  assert out[1] is bad
  c.designer.audit = False
  assert design_lib.solvability_audit(c, engine, 0, 0, ["a"], [ok])[0] == [ok]


def test_an_audit_prompt_over_budget_keeps_its_program():
  from spade.selfplay import design as design_lib

  c = _config()
  c.designer.audit = True
  c.model.max_len = 256
  engine = fakes.FakeEngine(c)
  ok = records.Verdict.from_dict({"valid": True, "reason": "ok"})
  out, _ = design_lib.solvability_audit(c, engine, 0, 0, ["a"], [ok])
  assert out == [ok] and engine.sampled == []


class _Repeater(fakes.FakeEngine):
  """Writes the same program every time (its hints are the parent's)."""

  def sample(self, prompts, **kwargs):
    outs = super().sample(prompts, **kwargs)
    if kwargs["role"] == "designer" and "```python" in outs[0][2]:
      return [outs[0]] * len(outs)
    return outs


@pytest.mark.parametrize("mode", ["play", "refuse"])
def test_a_copy_of_an_archived_program_is_played_unless_refused(mode):
  # The reference has no duplicate filter ("play"); "refuse" is ours.
  c = _config(**{"designer.duplicates": mode})
  t = _trainer(c, _Repeater(c))
  designs, metrics = _design(t, 0)
  assert metrics["memory/duplicates_this_iter"] == len(designs) - 1
  designs, metrics = _design(t, 1)
  assert metrics["memory/duplicates_this_iter"] == len(designs)
  if mode == "play":
    assert all(d.valid for d in designs)
  else:
    assert not any(d.valid for d in designs)
    assert {d.verdict.reason for d in designs} == {"duplicate"}
