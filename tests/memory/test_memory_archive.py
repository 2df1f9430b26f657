"""The archive: duplicates, retrieval, replay, capacity, state round trip."""

import json

import jax
import numpy as np
import pytest

from spade import config as config_lib
from spade.grounding import Document
from spade.memory import Archive

import memory_programs as programs

OK = {"valid": True, "reason": "ok", "message": ""}


def _bad(reason="smoke_steps", message="step() raised KeyError"):
  return {"valid": False, "reason": reason, "message": message}


def _config(**overrides):
  c = config_lib.base_config().memory
  for k, v in overrides.items():
    c[k] = v
  return c


def _played(archive, env_id, regret, iteration=1):
  archive.update_stats(
      env_id,
      iteration=iteration,
      regret=regret,
      win_rate_hint=0.5 + regret / 2,
      win_rate_nohint=0.5 - regret / 2,
      episodes=4,
  )


def test_renamed_copy_is_rejected_and_a_different_game_is_not():
  a = Archive(_config())
  guess, dup = a.add(
      programs.GUESS, verdict=OK, iteration=0, grounding_id="doc-1"
  )
  assert (guess, dup) == ("env-000000", None)
  copy = programs.renamed(
      programs.GUESS, {"secret": "target", "turns": "n", "guess": "g"}
  )
  assert a.add(copy, verdict=OK, iteration=1) == (None, "env-000000")
  # A copy with small edits and the same names: caught by MinHash.
  edited = programs.GUESS.replace("max_turns=7", "max_turns=8")
  assert a.add(edited, verdict=OK, iteration=1) == (None, "env-000000")
  assert a.add(programs.HANOI, verdict=OK, iteration=1) == ("env-000001", None)
  assert len(a) == 2
  assert a.metrics()["memory/duplicates_rejected"] == 2.0
  entry = a["env-000000"]
  assert a.get("env-000000") is entry and a.get("env-000009") is None
  assert entry.description.startswith("Guess a secret number between 1 and")
  assert entry.lineage.iteration == 0 and entry.grounding_id == "doc-1"


def test_invalid_programs_are_archived_with_reason_but_never_replayed():
  a = Archive(_config())
  bad_id, _ = a.add(programs.WORDS, verdict=_bad(), iteration=0)
  e = a[bad_id]
  assert not e.valid and e.reason == "smoke_steps: step() raised KeyError"
  # The fixed version of a failed program is not its duplicate ...
  fixed_id, dup = a.add(programs.WORDS + "\n", verdict=OK, iteration=1)
  assert fixed_id == "env-000001" and dup is None
  # ... but a broken copy of a valid program is.
  hanoi, _ = a.add(programs.HANOI, verdict=OK, iteration=2)
  assert a.add(programs.HANOI, verdict=_bad(), iteration=2) == (None, hanoi)
  assert sorted(a.replay(5, 0, 3)) == [fixed_id, hanoi]
  with pytest.raises(ValueError, match="needs a 'valid' key"):
    a.add(programs.ARITH, verdict={"reason": "ok"}, iteration=0)


def test_prompt_examples_top_regret_neighbour_and_failure():
  a = Archive(_config())
  guess, _ = a.add(programs.GUESS, verdict=OK, iteration=0)
  hanoi, _ = a.add(programs.HANOI, verdict=OK, iteration=0, grounding_id="pegs")
  words, _ = a.add(programs.WORDS, verdict=OK, iteration=0)
  arith, _ = a.add(programs.ARITH, verdict=_bad(), iteration=1)
  _played(a, guess, 0.2)
  _played(a, hanoi, 0.1)
  _played(a, words, 0.6)
  ex = a.prompt_examples(None, 2)
  assert [e.id for e in ex] == [words, arith]
  doc = Document(id="pegs", title="", text="", source="jsonl")
  ex = a.prompt_examples(doc, 4)
  assert [e.id for e in ex] == [words, hanoi, arith, guess]
  assert not ex[2].valid and ex[2].reason.startswith("smoke_steps")
  # No document id match: the neighbour shares words with the description.
  doc = Document(
      id="x", title="Numbers", text="A secret number, guessed.", source="text"
  )
  assert [e.id for e in a.prompt_examples(doc, 2)] == [words, guess]
  assert a.prompt_examples(doc, 0) == []


def test_replay_probabilities_follow_the_configured_formula():
  a = Archive(_config(replay_temperature=0.5, staleness_coef=0.3))
  ids = [a.add(p, verdict=OK, iteration=0)[0] for p in programs.ALL[:3]]
  a.add(programs.ARITH, verdict=_bad(), iteration=0)
  for env_id, regret, it in zip(ids, (0.5, 0.9, 0.1), (1, 3, 0)):
    if it:
      _played(a, env_id, regret, iteration=it)
    else:
      a.update_stats(
          env_id,
          iteration=0,
          regret=regret,
          win_rate_hint=1.0,
          win_rate_nohint=0.9,
          episodes=2,
      )
  p = a.replay_probabilities(4)
  w = np.array([1 / 4, 1.0, 1 / 9])  # (1/rank)**(1/0.5), ranks [2, 1, 3]
  expected = 0.7 * w / w.sum() + 0.3 * np.array([3, 1, 4]) / 8
  np.testing.assert_allclose([p[i] for i in ids], expected, rtol=1e-6)
  drawn = a.replay(10, 7, 4)
  assert sorted(drawn) == sorted(ids)  # capped at the 3 valid, distinct
  np.testing.assert_allclose(sum(a.replay_probabilities(5).values()), 1.0)


def test_mutation_parent_is_a_played_high_regret_entry():
  a = Archive(_config(mutation_pool=2))
  assert a.mutation_parent(0) is None
  ids = [a.add(p, verdict=OK, iteration=0)[0] for p in programs.ALL]
  for env_id, regret in zip(ids, (0.1, 0.8, 0.5, 0.0)):
    _played(a, env_id, regret)
  parents = {a.mutation_parent(seed).id for seed in range(20)}
  assert parents == {ids[1], ids[2]}
  for key in (jax.random.key(3), jax.random.PRNGKey(3)):
    assert a.mutation_parent(key).id in parents
  with pytest.raises(TypeError, match="int seed or a JAX PRNG key"):
    a.mutation_parent("seed")


def test_capacity_evicts_invalid_then_lowest_regret_but_not_recent():
  a = Archive(_config(capacity=4, keep_recent=1, duplicate_threshold=1.0))
  ids = []
  for k in range(4):
    verdict = _bad() if k == 1 else OK
    ids.append(a.add(programs.numbered(k), verdict=verdict, iteration=k)[0])
  _played(a, ids[0], 0.9)
  _played(a, ids[2], 0.1)
  _played(a, ids[3], 0.5)
  ids.append(a.add(programs.numbered(4), verdict=OK, iteration=4)[0])
  assert ids[1] not in a and len(a) == 4  # the invalid one went first
  ids.append(a.add(programs.numbered(5), verdict=OK, iteration=5)[0])
  # Lowest latest regret among the unprotected: ids[4] (never played, 0.0).
  assert ids[4] not in a and ids[5] in a
  _played(a, ids[5], 0.7)
  ids.append(a.add(programs.numbered(6), verdict=OK, iteration=6)[0])
  assert ids[2] not in a  # 0.1 < 0.5 < 0.7 < 0.9
  assert sorted(e.id for e in a.entries()) == sorted(
      [ids[0], ids[3], ids[5], ids[6]]
  )
  assert a.metrics()["memory/evicted"] == 3.0
  # An evicted program's renamed copy is still a duplicate.
  copy = programs.numbered(2).replace("Table2Env", "RenamedEnv")
  assert a.add(copy, verdict=OK, iteration=7) == (None, ids[2])
  with pytest.raises(KeyError, match="evicted"):
    a.update_stats(
        ids[2],
        iteration=7,
        regret=0.0,
        win_rate_hint=0.0,
        win_rate_nohint=0.0,
        episodes=1,
    )


def test_entries_replayed_this_iteration_are_not_evicted():
  a = Archive(_config(capacity=2, keep_recent=0, duplicate_threshold=1.0))
  first = a.add(programs.numbered(0), verdict=OK, iteration=0)[0]
  second = a.add(programs.numbered(1), verdict=OK, iteration=0)[0]
  _played(a, second, 0.9)
  assert first in a.replay(2, 0, 1)
  newest = a.add(programs.numbered(2), verdict=OK, iteration=1)[0]
  assert len(a) == 2
  # Both old entries were replayed this iteration, so the oldest goes.
  assert first not in a and second in a
  # A replay in an earlier iteration protects nothing: `second` (0.9) is
  # now the lowest-regret entry.
  _played(a, newest, 0.95, iteration=1)
  third = a.add(programs.numbered(3), verdict=OK, iteration=2)[0]
  assert second not in a and newest in a and third in a


def test_state_dict_round_trips_through_json():
  cfg = _config()
  a = Archive(cfg)
  ids = [a.add(p, verdict=OK, iteration=0)[0] for p in programs.ALL[:3]]
  a.add(programs.ARITH, verdict=_bad(), iteration=1, parent=ids[0])
  a.add(programs.renamed(programs.GUESS, {"secret": "s"}), verdict=OK,
        iteration=1)  # fmt: skip
  for env_id, regret in zip(ids, (0.3, 0.7, 0.2)):
    _played(a, env_id, regret, iteration=2)
  a.replay(2, 3, 3)
  a.set_replay_fraction(0.25)
  state = json.loads(json.dumps(a.state_dict()))
  b = Archive.from_state_dict(cfg, state)
  assert b.state_dict() == a.state_dict()
  assert b.metrics() == a.metrics()
  assert b["env-000003"].lineage.parent == ids[0]
  assert b["env-000001"].stats.regret == [0.7]
  assert b["env-000001"].stats.get("regret") == 0.7
  assert b["env-000001"].stats.get("times_played") == 1
  assert b["env-000003"].stats.get("regret") is None
  assert b.replay_probabilities(5) == a.replay_probabilities(5)
  assert b.replay(2, 11, 5) == a.replay(2, 11, 5)
  assert b.add(programs.HANOI, verdict=OK, iteration=6) == (None, ids[1])
  # Without saved signatures they are recomputed from the code.
  bare = {k: v for k, v in state.items() if k != "signatures"}
  assert Archive.from_state_dict(cfg, bare).state_dict() == state
  with pytest.raises(ValueError, match="version"):
    Archive.from_state_dict(cfg, {**state, "version": 99})


def test_restore_under_a_smaller_capacity_evicts_by_policy():
  a = Archive(_config(duplicate_threshold=1.0))
  ids = [a.add(programs.numbered(k), verdict=OK, iteration=k)[0]
         for k in range(6)]  # fmt: skip
  for env_id, regret in zip(ids, (0.6, 0.1, 0.5, 0.2, 0.4, 0.3)):
    _played(a, env_id, regret, iteration=6)
  b = Archive.from_state_dict(
      _config(capacity=3, keep_recent=1, duplicate_threshold=1.0),
      a.state_dict(),
  )
  assert [e.id for e in b.entries()] == [ids[0], ids[2], ids[5]]
  assert sorted(b.replay(5, 0, 7)) == [ids[0], ids[2], ids[5]]


def test_disabled_memory_records_but_neither_rejects_nor_retrieves():
  a = Archive(_config(enabled=False))
  first, _ = a.add(programs.GUESS, verdict=OK, iteration=0)
  second, dup = a.add(programs.GUESS, verdict=OK, iteration=1)
  assert first and second and dup is None
  _played(a, first, 0.9)
  assert a.prompt_examples(None, 2) == []
  assert a.replay(2, 0, 2) == []
  assert a.mutation_parent(0) is None
  assert a.metrics()["memory/duplicates_rejected"] == 0.0


def test_metrics_report_size_duplicates_replay_fraction_and_diversity():
  a = Archive(_config())
  for p in programs.ALL:
    a.add(p, verdict=OK, iteration=0)
  a.add(programs.GUESS, verdict=OK, iteration=1)
  a.set_replay_fraction(0.5)
  m = a.metrics()
  assert m["memory/size"] == 4.0 and m["memory/valid"] == 4.0
  assert m["memory/duplicates_rejected"] == 1.0
  assert m["memory/replay_fraction"] == 0.5
  assert 0.85 < m["memory/diversity"] <= 1.0
  with pytest.raises(ValueError, match="must be in"):
    a.set_replay_fraction(1.5)
  with pytest.raises(ValueError, match="keep_recent"):
    Archive(_config(capacity=4, keep_recent=4))
