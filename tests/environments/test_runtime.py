"""The runtime: prelude, reference-format programs, ToolUseBaseEnv, loader."""

import json
import os
import subprocess
import sys

import pytest

from spade.environments import runtime
from spade.environments import tool_calls

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def _fixture(name):
  with open(os.path.join(FIXTURES, name), encoding="utf-8") as f:
    return f.read()


def _call(name, **arguments):
  payload = json.dumps({"name": name, "arguments": arguments})
  return f"<tool_call>{payload}</tool_call>"


@pytest.fixture(scope="module")
def tool_env():
  env = runtime.load_program(_fixture("reference_tool_use.py"))()
  env.reset(seed=3)
  return env


def test_prelude_binds_the_reference_names():
  names = runtime.prelude()
  for name in (
      "random",
      "re",
      "math",
      "json",
      "itertools",
      "collections",
      "deque",
      "defaultdict",
      "Counter",
      "Tuple",
      "Optional",
      "copy",
      "string",
      "functools",
      "heapq",
      "dataclass",
      "np",
      "ToolUseBaseEnv",
  ):
    assert name in names, name
  assert names["deque"] is __import__("collections").deque
  assert names["np"].__name__ == "numpy"


def test_program_that_forgot_its_imports_loads():
  source = (
      "class CountEnv:\n"
      "  def reset(self, seed=None):\n"
      "    q = deque([1, 2]); c = Counter('aab')\n"
      "    return f'{len(q)} {c[\"a\"]} {math.floor(2.5)}', {}\n"
  )
  env = runtime.load_program(source)()
  assert env.reset() == ("2 2 2", {})


def test_dataclasses_with_string_annotations_load():
  source = (
      "from __future__ import annotations\n"
      "import dataclasses, typing\n"
      "@dataclasses.dataclass\n"
      "class Cell:\n"
      "  x: int\n"
      "  tag: typing.ClassVar[str] = 'c'\n"
      "class GridEnv:\n"
      "  def reset(self, seed=None):\n"
      "    return repr(Cell(3)), {}\n"
  )
  assert runtime.load_program(source)().reset() == ("Cell(x=3)", {})


def test_reference_game_fixture_plays_and_wins():
  cls = runtime.load_program(_fixture("reference_game.py"))
  assert cls.__name__ == "HiddenSumGameEnv"
  env = cls()
  obs, info = env.reset(seed=5)
  assert "\\boxed{ab}" in obs and info == {}
  answer = env.solution()
  obs, reward, terminated, truncated, _ = env.step("\\boxed{ab}")
  assert obs.startswith("ab = ") and reward == 0.0 and not terminated
  # math_verify's equivalence: "137.0" matches "137".
  out = env.step(f"I think \\boxed{{{answer}.0}}")
  assert out == ("Correct!", 1.0, True, False, {})


def test_tool_use_fixture_schema(tool_env):
  assert isinstance(tool_env, runtime.ToolUseBaseEnv)
  tools = {t["function"]["name"]: t for t in tool_env.get_tools()}
  assert set(tools) == {"list_warehouses", "get_stock"}
  assert tools["get_stock"]["type"] == "function"
  params = tools["get_stock"]["function"]["parameters"]
  assert params["required"] == ["warehouse", "product"]


def test_tool_use_protocol(tool_env):
  env = tool_env
  env.reset(seed=3)
  obs, reward, term, trunc, _ = env.step(_call("list_warehouses"))
  assert obs == 'Tool result:\n["east", "north", "south"]'
  assert (reward, term, trunc) == (0.0, False, False)
  total = 0
  for w in ("east", "north", "south"):
    obs, *_ = env.step(_call("get_stock", warehouse=w, product=env._product))
    total += int(obs.split("\n")[1])
  assert len(env._call_history) == 4
  assert env.step("no tags at all")[1] == pytest.approx(-0.1)
  assert env.step("<tool_call>{not json</tool_call>")[1] == pytest.approx(-0.1)
  obs, reward, *_ = env.step(_call("delete_everything"))
  assert reward == 0.0 and "Available: list_warehouses, get_stock" in obs
  obs, reward, *_ = env.step("<answer>-1</answer>")
  assert (obs, reward) == ("Incorrect. Keep using tools.", 0.0)
  # Tolerant numeric match: "$1,234.00" style answers count.
  assert env._check_answer(f"${total:,}.00")
  assert env.step(f"<answer>{total}</answer>") == (
      "Correct!",
      1.0,
      True,
      False,
      {},
  )


def test_tool_use_truncation_reveals_the_solution():
  env = runtime.load_program(_fixture("reference_tool_use.py"))(max_turns=2)
  env.reset(seed=0)
  env.step(_call("list_warehouses"))
  obs, reward, term, trunc, _ = env.step("<answer>nope</answer>")
  assert (reward, term, trunc) == (0.0, False, True)
  assert "Solution:" in obs and env._expected_answer in obs


def test_execute_tool():
  env = runtime.load_program(_fixture("reference_tool_use.py"))()
  out = env.execute_tool("list_warehouses", {})
  assert out == {"output": '["east", "north", "south"]', "returncode": 0}
  assert env.execute_tool("nope", {})["returncode"] == 1


def test_import_of_the_base_module_works_as_upstream():
  source = (
      "from tool_use_base_env import ToolUseBaseEnv\n"
      "class EchoEnv(ToolUseBaseEnv):\n"
      "  def reset(self, seed=None):\n"
      "    self._expected_answer = '7'\n"
      "    return 'say 7', {}\n"
  )
  env = runtime.load_program(source)()
  assert env.step("<answer>7.001</answer>")[1] == 1.0


_PLAYABLE = "  def reset(self, seed=None):\n    return 'x', {}\n" + (
    "  def step(self, action):\n    return 'x', 0.0, True, False, {}\n"
)


def test_first_env_class_is_taken_as_the_reference_takes_it():
  # The reference's loader: the first name defined that ends in "Env".
  source = f"class AEnv:\n{_PLAYABLE}class BEnv:\n{_PLAYABLE}"
  assert runtime.load_program(source).__name__ == "AEnv"
  cls, names = runtime.load_program_with_candidates(source)
  assert (cls.__name__, names) == ("AEnv", ["AEnv", "BEnv"])


def test_leading_class_without_reset_and_step_is_passed_over():
  # An empty base (or a helper) first: the reference would take it and fail.
  source = (
      f"class GameBaseEnv:\n  pass\nclass RealEnv(GameBaseEnv):\n{_PLAYABLE}"
  )
  assert runtime.load_program(source).__name__ == "RealEnv"


def test_instantiate_retries_with_max_turns():
  source = (
      "class TurnsEnv:\n  def __init__(self, max_turns):\n"
      f"    self.max_turns = max_turns\n{_PLAYABLE}"
  )
  cls = runtime.load_program(source)
  assert runtime.instantiate(cls).max_turns == 10
  assert runtime.instantiate(cls, max_turns=25).max_turns == 25
  assert runtime.instantiate(cls, {"max_turns": 3}).max_turns == 3
  with pytest.raises(TypeError):
    runtime.instantiate(cls, {"colour": "red"})
  tool_cls = runtime.load_program(_fixture("reference_tool_use.py"))
  assert runtime.instantiate(tool_cls).max_turns == 10  # its own default


def test_reset_result_reads_a_bare_observation():
  assert runtime.reset_result("obs") == ("obs", {})
  assert runtime.reset_result(("obs", {"k": 1})) == ("obs", {"k": 1})
  assert runtime.reset_result(["obs"]) == (["obs"], None)


@pytest.mark.parametrize(
    "source,reason",
    [
        ("class BrokenEnv(:\n  pass\n", "syntax"),
        ("raise ValueError('boom')\n", "load"),
        ("class Helper:\n  pass\n", "no_env_class"),
        ("class Env:\n  pass\nclass ToolUseBaseEnv:\n  pass\n", "no_env_class"),
    ],
)
def test_program_errors(source, reason):
  with pytest.raises(runtime.ProgramError) as e:
    runtime.load_program(source)
  assert e.value.reason == reason
  assert e.value.message


def test_runtime_and_validator_import_with_the_standard_library_only():
  # The sandbox worker imports them before numpy/math_verify are preloaded.
  code = (
      "import sys\n"
      "import spade.environments.runtime, spade.environments.validator\n"
      "heavy = {'numpy', 'math_verify', 'jax', 'gymnasium', 'ml_collections'}"
      "\n"
      "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
  )
  root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
  out = subprocess.run(
      [sys.executable, "-c", code],
      cwd=root,
      capture_output=True,
      text=True,
      check=True,
  )
  assert out.stdout.strip() == "[]"


def test_fifteen_tool_calls_win_within_the_default_ten_turns():
  # The reference's play rules: each call runs through execute_tool without
  # spending a turn; only the answer is a step().
  env = runtime.instantiate(
      runtime.load_program(_fixture("variants/long_tool_chain.py"))
  )
  assert env.max_turns == 10
  env.reset(seed=11)
  has_tools = bool(env.get_tools())
  calls, outputs, last = 0, [], None
  for reply in env.solution():
    for kind, action in tool_calls.reply_actions(reply, has_tools):
      if kind == "tool":
        result = env.execute_tool(action["name"], action["arguments"])
        assert result["returncode"] == 0
        outputs.append(int(result["output"]))
        calls += 1
      else:
        last = env.step(action)
  assert calls == 15 and env.turn_count == 1
  assert sum(outputs) == int(env._expected_answer)
  assert last == ("Correct!", 1.0, True, False, {})


def test_tool_calls_sent_through_step_spend_turns():
  # Sent one per step instead, the same calls run out of turns: the reason
  # play sends them through execute_tool.
  env = runtime.instantiate(
      runtime.load_program(_fixture("variants/long_tool_chain.py"))
  )
  env.reset(seed=11)
  out = None
  for i in range(15):
    out = env.step(_call("read_envelope", index=i))
    if out[3]:
      break
  assert i == 9 and out[3] and "Time up." in out[0]
