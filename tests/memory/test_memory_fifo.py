"""The reference's memory: FIFO, difficulty band, top-pool sampling, names."""

import json

from spade.designer import design_prompts
from spade.memory import fifo


def _filled(capacity=200, seed=0):
  m = fifo.FifoMemory(capacity=capacity, seed=seed)
  return m


def test_fifo_keeps_the_newest_and_cuts_code():
  m = fifo.FifoMemory(capacity=3, code_chars=50)
  for i in range(5):
    m.add(f"g{i}", "Optimization", "x" * 100, win_rate=0.5, rollout_id=i)
  assert [r.name for r in m.records] == ["g2", "g3", "g4"]
  code = m.records[0].code
  assert len(code) == 50 and code.startswith(fifo.FILE_HEADER)
  assert fifo.game_name(4, 3, "Logical Deduction") == (
      "game_00004_003_logical_deduction"
  )


def test_positives_are_drawn_from_the_top_pool_in_the_band():
  m = fifo.FifoMemory(seed=1)
  # 14 in-band records of the skill with regrets 0.00 .. 0.13, plus records
  # out of the band or of another skill with higher regret.
  for i in range(14):
    m.add(f"in{i}", "Optimization", "c", win_rate=0.5, regret=i / 100)
  m.add("easy", "Optimization", "c", win_rate=0.86, regret=1.0)
  m.add("hard", "Optimization", "c", win_rate=0.14, regret=1.0)
  m.add("other", "Logical Deduction", "c", win_rate=0.5, regret=1.0)
  m.add("edge_lo", "Optimization", "c", win_rate=0.15, regret=0.5)
  m.add("edge_hi", "Optimization", "c", win_rate=0.85, regret=0.5)
  drawn = set()
  for _ in range(300):
    picks = m.positives("Optimization", n=2)
    assert len(picks) == 2 and len({p.name for p in picks}) == 2
    drawn.update(p.name for p in picks)
  # Top max(3 * 2, 10) = 10 by regret: both edges (0.5), then in13 .. in6.
  want = {"edge_lo", "edge_hi"} | {f"in{i}" for i in range(6, 14)}
  assert drawn == want
  assert m.positives("Causal Inference") == []


def test_negatives_of_the_skill_by_name_only():
  m = fifo.FifoMemory(seed=0)
  m.add("game_00000_000_optimization", "Optimization", "class AEnv: pass",
        win_rate=0.95)  # fmt: skip
  m.add("mid", "Optimization", "class BEnv: pass", win_rate=0.5, regret=0.3)
  m.add("hard_other", "Logical Deduction", "class CEnv: pass", win_rate=0.0)
  examples = m.prompt_examples("Optimization")
  assert [(e.name, e.negative) for e in examples] == [
      ("mid", False),
      ("game_00000_000_optimization", True),
  ]
  user = design_prompts.designer_messages(None, examples)[1]["content"]
  assert (
      "### Example 1 (skill: Optimization, win_rate: 0.50, regret: 0.30)"
      in (user)
  )
  assert "class BEnv: pass" in user  # a positive shows its code
  assert (
      "Avoid generating environments like:\n"
      "- too easy (win_rate=0.95): class game_00000_000_optimization"
  ) in user
  assert "class AEnv" not in user  # a negative shows only its name
  assert fifo.FifoMemory().prompt_examples("Optimization") == []


def test_state_round_trips_through_json():
  m = fifo.FifoMemory(seed=3)
  for i in range(12):
    m.add(f"g{i}", "Optimization", "c", win_rate=0.5, regret=i)
  state = json.loads(json.dumps(m.state_dict()))
  again = fifo.FifoMemory()
  again.load_state_dict(state)
  assert [r.name for r in again.records] == [r.name for r in m.records]
  # The generator continues where it was: the same draws follow.
  assert [r.name for r in again.positives("Optimization", 2)] == [
      r.name for r in m.positives("Optimization", 2)
  ]


def test_seeded_programs_are_positives_of_their_skill_or_of_any():
  m = fifo.FifoMemory(seed=0, code_chars=40)
  m.seed(
      [
          ("maze", "Spatial Reasoning", "class MazeEnv: pass\n" * 5),
          ("any", fifo.ANY_SKILL, "class AnyEnv: pass\n"),
      ]
  )
  assert [r.rollout_id for r in m.records] == [-1, -1]
  assert all(len(r.code) <= 40 for r in m.records)
  shown = {r.name for r in m.positives("Spatial Reasoning", n=2)}
  assert shown == {"maze", "any"}
  assert {r.name for r in m.positives("Optimization", n=2)} == {"any"}
  assert m.negatives("Spatial Reasoning") == []  # inside the band
