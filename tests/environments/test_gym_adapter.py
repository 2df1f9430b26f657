"""The gymnasium adapter over the sandbox pool."""

import os

import gymnasium
import pytest

from spade.environments import gym_adapter
from spade.environments import library
from spade.environments import runtime
from spade.environments import tool_calls
from spade.sandbox import SandboxError
from spade.sandbox import SandboxPool

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")

CRASHING = (
    "class FragileEnv:\n"
    '  """Breaks on its first step."""\n'
    "  def reset(self, seed=None):\n"
    "    return 'hello', {}\n"
    "  def step(self, action):\n"
    "    raise RuntimeError('broken step')\n"
)


@pytest.fixture(scope="module")
def pool():
  # Trusted seed programs only: the "none" backend keeps this test fast and
  # independent of runsc; test_seeds covers gVisor.
  with SandboxPool("none", num_sandboxes=1, warm_spare=False) as p:
    yield p


def test_spaces_and_a_winning_episode(pool):
  program = library.get_program("grid_maze")
  env = gym_adapter.ProgramEnv(program.source, pool, render_mode="ansi")
  assert isinstance(env, gymnasium.Env)
  assert isinstance(env.observation_space, gymnasium.spaces.Text)
  obs, info = env.reset(seed=3)
  assert env.observation_space.contains(obs) and info == {}
  assert env.action_space.contains("\\boxed{up} — with any text ✓")
  local = runtime.load_program(program.source)()
  assert local.reset(seed=3)[0] == obs  # the same episode as in-process
  plan = env.solution()
  assert plan == local.solution()
  assert env.hint().startswith("The shortest route begins")
  for action in plan:
    obs, reward, terminated, truncated, info = env.step(action)
  assert (reward, terminated, truncated) == (1.0, True, False)
  assert env.render() == obs
  env.close()
  assert env.handle is None


def test_unseeded_resets_follow_gymnasium_seeding(pool):
  source = library.get_program("mastermind").source
  a = gym_adapter.ProgramEnv(source, pool)
  b = gym_adapter.ProgramEnv(source, pool)
  a.reset(seed=11)
  b.reset(seed=11)
  assert a.reset()[0] == b.reset()[0]
  assert a.solution() == b.solution()
  a.close()
  b.close()


def test_tool_use_program(pool):
  env = gym_adapter.ProgramEnv(library.get_program("table_query").source, pool)
  env.reset(seed=0)
  names = {t["function"]["name"] for t in env.get_tools()}
  assert names == {"count_by_department", "list_employees", "max_salary"}
  obs, reward, *_ = env.step("no tool call")
  assert reward == pytest.approx(-0.1) and obs.startswith("Format error")
  env.close()


def test_step_failure_ends_the_episode_with_its_reason(pool):
  env = gym_adapter.ProgramEnv(CRASHING, pool)
  assert env.reset(seed=0)[0] == "hello"
  assert env.hint() is None  # no hint() method
  obs, reward, terminated, truncated, info = env.step("anything")
  # The reference's outcome of an exception in step(): -1, episode over.
  assert (reward, terminated, truncated) == (-1.0, True, False)
  assert obs == "Error: RuntimeError: broken step"
  assert info["error"] == "exception" and "broken step" in info["message"]
  assert env.reset(seed=0)[0] == "hello"  # a fresh process
  env.close()


def _variant(name):
  with open(os.path.join(FIXTURES, "variants", name), encoding="utf-8") as f:
    return f.read()


def test_fifteen_tool_calls_then_the_answer_win_in_the_sandbox(pool):
  env = gym_adapter.ProgramEnv(_variant("long_tool_chain.py"), pool)
  env.reset(seed=5)
  has_tools = bool(env.get_tools())
  outputs, last = [], None
  for reply in env.solution():
    for kind, action in tool_calls.reply_actions(reply, has_tools):
      if kind == "tool":
        result = env.execute_tool(action["name"], action["arguments"])
        outputs.append(int(result["output"]))
      else:
        last = env.step(action)
  assert len(outputs) == 15
  assert last[1:4] == (1.0, True, False) and last[0] == "Correct!"
  env.close()


def test_reference_forms_of_reset_and_init_in_the_sandbox(pool):
  bare = gym_adapter.ProgramEnv(_variant("reset_bare_string.py"), pool)
  assert bare.reset(seed=1) == (
      "Guess the hidden number from 1 to 50; reply \\boxed{N}.",
      {},
  )
  assert bare.execute_tool("anything", {})["returncode"] == 1  # a game
  bare.close()
  # __init__(self, max_turns) without a default: retried with max_turns=.
  turns = gym_adapter.ProgramEnv(_variant("init_requires_max_turns.py"), pool)
  obs, _ = turns.reset(seed=2)
  assert obs.startswith("Reach exactly ")
  turns.close()


def test_a_program_that_does_not_load(pool):
  with pytest.raises(SandboxError) as e:
    gym_adapter.ProgramEnv("class BrokenEnv(:\n", pool)
  assert e.value.reason == "syntax"


def test_gymnasium_make(pool):
  env = gymnasium.make(
      gym_adapter.ENV_ID,
      source=library.get_program("hangman").source,
      pool=pool,
  )
  obs, _ = env.reset(seed=1)
  assert obs.startswith("Hangman.")
  obs, reward, terminated, truncated, _ = env.step("\\boxed{e}")
  assert obs.startswith("'e' is in the word.") and reward == 0.0
  assert env.unwrapped.hint().startswith("The word has 8 letters")
  env.close()
  assert env.unwrapped.handle is None
