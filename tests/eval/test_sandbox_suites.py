"""Planted-answer tests of the suites that execute code in the gVisor sandbox.

Known-correct replies (HumanEval's canonical solutions; the environments' own
`solution()` actions) must score 1.0 and known-wrong ones 0.0.
"""

import collections
import os

import pytest

from spade.agent import prompts as agent_prompts
from spade.eval import humaneval_suite
from spade.eval import registry
from spade.eval import runner
from spade.eval import seed_heldout_suite

pytestmark = pytest.mark.sandbox

SEEDS = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    "spade",
    "environments",
    "seeds",
)
Program = collections.namedtuple("Program", "name source")


@pytest.fixture(scope="module")
def pool():
  from spade.sandbox import pool as pool_lib  # pylint: disable=g-import-not-at-top

  with pool_lib.SandboxPool(backend="gvisor", num_sandboxes=1) as p:
    yield p


def test_humaneval_scores_planted_answers(config, scripted, pool):
  config.eval.humaneval_timeout_s = 3.0  # the looping reply times out
  suite = runner.build("humaneval", config)
  problems = {p["prompt"]: p for p in suite.items(4)}

  def fenced_full_function(messages):
    p = problems[messages[-1]["content"]]
    # The whole function (signature + docstring + body) in a fence.
    return f"Here:\n```python\n{p['prompt']}{p['canonical_solution']}```\n"

  for reply_fn, expected in (
      (lambda m: problems[m[-1]["content"]]["canonical_solution"], 1.0),
      (fenced_full_function, 1.0),
      (lambda m: "    return None\n", 0.0),
      (lambda m: "```python\nwhile True:\n    pass\n```", 0.0),
  ):
    lines = []
    result = suite.run(scripted(reply_fn), num_examples=4, pool=pool,
                       log=lines.append)  # fmt: skip
    assert [i.score for i in result.items] == [expected] * 4, lines
  assert "passed" not in lines[0] and "timeout" in lines[0]


def test_humaneval_needs_a_pool(config, scripted):
  suite = runner.build("humaneval", config)
  with pytest.raises(Exception, match="SandboxPool"):
    suite.run(scripted(lambda m: ""), num_examples=1)


def _programs(*names):
  out = []
  for name in names:
    with open(os.path.join(SEEDS, f"{name}.py")) as f:
      out.append(Program(name, f.read()))
  return out


def _solution_plans(suite, pool, num_examples):
  """First observation -> the environment's own winning actions."""
  plans = {}
  for _, source, seed in suite.episodes(num_examples):
    handle = pool.create(source)
    observation, _ = pool.reset(handle, seed)
    if "ToolUseBaseEnv" in source:
      observation += agent_prompts.tools_suffix(pool.call(handle, "get_tools"))
    plans[observation] = pool.call(handle, "solution")
    pool.close_env(handle)
  assert all(isinstance(p, list) and p for p in plans.values())

  def replay(messages):
    played = sum(1 for m in messages if m["role"] == "assistant")
    first = next(m["content"] for m in messages if m["role"] == "user")
    (plan,) = [p for obs, p in plans.items() if obs in first]
    return plan[played]

  return replay


def test_seed_heldout_scores_planted_answers(config, scripted, pool):
  config.eval.max_turns = 40
  programs = _programs("grid_maze", "order_lookup", "hangman")
  suite = seed_heldout_suite.SeedHeldoutSuite(
      registry.eval_config(config), programs=programs
  )
  replay = _solution_plans(suite, pool, 4)

  lines = []
  result = suite.run(scripted(replay), num_examples=4, pool=pool,
                     log=lines.append)  # fmt: skip
  assert [i.score for i in result.items] == [1.0] * 4, lines
  assert result.info["environments"] == ["grid_maze", "hangman", "order_lookup"]
  assert [i.item_id for i in result.items] == [
      "grid_maze/seed1234",
      "order_lookup/seed1234",
      "hangman/seed1234",
      "grid_maze/seed1235",
  ]
  assert pool.num_envs == 0  # every episode's environment was closed

  wrong = scripted(lambda m: "\\boxed{zzz} <answer>zzz</answer>")
  result = suite.run(wrong, num_examples=4, pool=pool, log=lambda _: None)
  assert [i.score for i in result.items] == [0.0] * 4


def test_seed_heldout_records_a_broken_environment(config, scripted, pool):
  config.eval.max_turns = 2
  broken = Program(
      "broken", "class BrokenEnv:\n  def __init__(self):\n    1/0\n"
  )
  suite = seed_heldout_suite.SeedHeldoutSuite(
      registry.eval_config(config), programs=[broken] + _programs("grid_maze")
  )
  lines = []
  result = suite.run(scripted(lambda m: "\\boxed{up}"), num_examples=2,
                     pool=pool, log=lines.append)  # fmt: skip
  assert result.items[0].score == 0.0
  assert "error=" in lines[0] and "broken/seed1234" in lines[0]
  assert "error=" not in lines[1]


def test_library_heldout_programs_replay_to_full_score(config, scripted, pool):
  """The library's held-out seeds, as the CLI plays them, solved and not."""
  config.eval.max_turns = 60
  suite = runner.build("seed_heldout", config)
  names = [p.name for p in seed_heldout_suite.heldout_programs()]
  assert len(names) >= 4
  replay = _solution_plans(suite, pool, len(names))
  lines = []
  result = suite.run(scripted(replay), num_examples=len(names), pool=pool,
                     log=lines.append)  # fmt: skip
  assert [i.score for i in result.items] == [1.0] * len(names), lines
  assert result.info["environments"] == sorted(names)
  wrong = scripted(lambda m: "\\boxed{zzz} <answer>zzz</answer>")
  result = suite.run(wrong, num_examples=len(names), pool=pool,
                     log=lambda _: None)  # fmt: skip
  assert result.score == 0.0
