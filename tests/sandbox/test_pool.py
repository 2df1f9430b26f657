"""The pool's API: environments, batches, validation, programs, config."""

import shutil
import time

import pytest

from spade import config as config_lib
from spade.environments import sandboxes
from spade.sandbox import SandboxError
from spade.sandbox import SandboxPool
from tests.sandbox.conftest import PROBE
from tests.sandbox.conftest import VALIDATE_TIMEOUT_S
from tests.sandbox.conftest import assert_pool_works
from tests.sandbox.conftest import probe

GAME = '''
class GuessEnv:
  """Guess the secret digit; the observation says higher or lower."""

  def __init__(self, max_turns=5, **kwargs):
    self.max_turns = max_turns
    self.secret = 0
    self.turns = 0

  def reset(self, seed=None):
    self.secret = random.Random(seed).randint(0, 9)
    self.turns = 0
    return "Guess a digit in \\\\boxed{}.", {"max_turns": self.max_turns}

  def step(self, action):
    self.turns += 1
    m = re.search(r"\\\\boxed\\{(\\d)\\}", action)
    if not m:
      return "Put a digit in \\\\boxed{}.", -0.1, False, self.turns >= 5, {}
    guess = int(m.group(1))
    if guess == self.secret:
      return "Correct!", 1.0, True, False, {}
    word = "higher" if guess < self.secret else "lower"
    return word, 0.0, False, self.turns >= self.max_turns, {"guess": guess}

  def hint(self):
    return f"The secret is odd: {self.secret % 2 == 1}"

  def solution(self):
    return ["\\\\boxed{%d}" % self.secret]
'''

TOOL_USE = '''
class LookupEnv(ToolUseBaseEnv):
  """Find the price of an item with the lookup tool and answer it."""

  def reset(self, seed=None):
    rng = random.Random(seed)
    self.turn_count = 0
    self._state = {"prices": {"apple": rng.randint(1, 9), "pear": 4}}
    self._expected_answer = str(self._state["prices"]["apple"])
    self._tools = {
        "lookup": {
            "description": "Price of an item.",
            "parameters": {
                "type": "object",
                "properties": {"item": {"type": "string"}},
                "required": ["item"],
            },
        }
    }
    return "What does an apple cost? Use the lookup tool.", {}

  def tool_lookup(self, item):
    return str(self._state["prices"].get(item, "unknown"))

  def solution(self):
    return "lookup(apple) then answer " + self._expected_answer
'''

NUMERIC = '''
class MathEnv:
  """Uses numpy and math_verify, as the contract allows."""

  def reset(self, seed=None):
    import math_verify  # preloaded by the worker: no import cost here
    self.ok = callable(math_verify.verify) and callable(math_verify.parse)
    return str(int(np.arange(5).sum())), {"verify": self.ok}

  def step(self, action):
    return action, 1.0, True, False, {}
'''

# Passes the static check, then reads far outside an array: SIGSEGV.
SEGFAULT = """
class CrashEnv:
  \"\"\"Reads memory it does not own.\"\"\"

  def reset(self, seed=None):
    a = np.lib.stride_tricks.as_strided(
        np.zeros(1), shape=(10**9,), strides=(1 << 20,))
    return str(a.sum()), {}

  def step(self, action):
    return "", 0.0, True, False, {}
"""


@pytest.mark.sandbox
def test_game_round_trip(gvisor_pool):
  h = gvisor_pool.create(GAME, {"max_turns": 3})
  obs, info = gvisor_pool.reset(h, seed=7)
  assert obs.startswith("Guess a digit") and info == {"max_turns": 3}
  secret = __import__("random").Random(7).randint(0, 9)
  assert gvisor_pool.call(h, "solution") == ["\\boxed{%d}" % secret]
  assert gvisor_pool.call(h, "hint") == (
      f"The secret is odd: {secret % 2 == 1}"
  )
  out = gvisor_pool.step(h, "no box")
  assert out == {
      "ok": True,
      "obs": "Put a digit in \\boxed{}.",
      "reward": -0.1,
      "terminated": False,
      "truncated": False,
      "info": {},
  }
  win = gvisor_pool.step(h, "\\boxed{%d}" % secret)
  assert (win["reward"], win["terminated"]) == (1.0, True)
  with pytest.raises(SandboxError) as e:
    gvisor_pool.call(h, "_private")
  assert e.value.reason == "exception"
  gvisor_pool.close_env(h)
  with pytest.raises(SandboxError) as e:
    gvisor_pool.reset(h, 0)
  assert e.value.reason == "closed"


@pytest.mark.sandbox
def test_tool_use_env_and_preloaded_modules(gvisor_pool):
  h = gvisor_pool.create(TOOL_USE)
  obs, _ = gvisor_pool.reset(h, seed=3)
  assert "apple" in obs
  tools = gvisor_pool.call(h, "get_tools")
  assert tools[0]["function"]["name"] == "lookup"
  price = __import__("random").Random(3).randint(1, 9)
  r = gvisor_pool.step(
      h,
      '<tool_call>{"name": "lookup", "arguments": {"item": "apple"}}'
      "</tool_call>",
  )
  assert r["ok"] and str(price) in r["obs"]
  r = gvisor_pool.step(h, f"<answer>{price}</answer>")
  assert (r["reward"], r["terminated"]) == (1.0, True)
  gvisor_pool.close_env(h)
  m = gvisor_pool.create(NUMERIC)
  assert gvisor_pool.reset(m, 0) == ("10", {"verify": True})
  gvisor_pool.close_env(m)


@pytest.mark.sandbox
def test_step_many_isolates_failures(gvisor_pool):
  handles = [gvisor_pool.create(PROBE) for _ in range(4)]
  for h in handles:
    gvisor_pool.reset(h, 0)
  out = gvisor_pool.step_many(
      [
          (handles[0], "result = 'a'"),
          (handles[1], "raise ValueError('boom')"),
          (handles[2], "result = 'c'"),
          (handles[0], "result = 'a2'"),
          (123456, "result = 'nobody'"),
          (handles[3], "result = float('nan')"),
      ]
  )
  assert [r["ok"] for r in out] == [True, False, True, True, False, True]
  assert out[0]["obs"] == "a" and out[3]["obs"] == "a2"
  assert out[1]["reason"] == "exception" and "boom" in out[1]["message"]
  assert out[4]["reason"] == "closed"
  assert out[5]["obs"] == "nan"
  # An exception does not end the environment.
  assert gvisor_pool.step(handles[1], "result = 'b'")["obs"] == "b"
  for h in handles:
    gvisor_pool.close_env(h)


BAD_RESET = """
class BadResetEnv:
  def reset(self, seed=None):
    return 42

  def step(self, action):
    return "", 0.0, True, False, {}
"""


@pytest.mark.sandbox
def test_open_many_creates_resets_and_calls_in_one_round_trip(gvisor_pool):
  before = sum(s["envs"] for s in gvisor_pool.stats())
  out = gvisor_pool.open_many(
      [
          {"source": GAME, "seed": 7, "calls": ["hint", "get_tools"]},
          {"source": TOOL_USE, "seed": 3, "calls": ["get_tools"]},
          {"source": "class BrokenEnv(:\n  pass", "seed": 0},
          {"source": BAD_RESET, "seed": 0},
          {"source": GAME, "seed": 8, "kwargs": {"max_turns": 1}},
      ]
  )
  secret = __import__("random").Random(7).randint(0, 9)
  game, tool, broken, bad_reset, short = out
  assert game["ok"] and game["obs"].startswith("Guess a digit")
  assert game["info"] == {"max_turns": 5}
  assert game["calls"]["hint"] == {
      "ok": True,
      "value": f"The secret is odd: {secret % 2 == 1}",
  }
  # A game has no get_tools(): that call fails alone, the env stays open.
  assert game["calls"]["get_tools"]["ok"] is False
  assert tool["calls"]["get_tools"]["value"][0]["function"]["name"] == (
      "lookup"
  )
  assert (broken["ok"], broken["reason"]) == (False, "syntax")
  assert bad_reset["ok"] is False and "reset() must return" in (
      bad_reset["message"]
  )
  assert short["info"] == {"max_turns": 1}
  # The opened environments are ordinary handles, spread over both
  # sandboxes; the failed ones left no environment behind.
  handles = [game["handle"], tool["handle"], short["handle"]]
  assert len({gvisor_pool.where(h)["name"] for h in handles}) == 2
  win = gvisor_pool.step(game["handle"], "\\boxed{%d}" % secret)
  assert (win["reward"], win["terminated"]) == (1.0, True)
  assert sum(s["envs"] for s in gvisor_pool.stats()) == before + 3
  for h in handles:
    gvisor_pool.close_env(h)
  assert sum(s["envs"] for s in gvisor_pool.stats()) == before
  assert_pool_works(gvisor_pool)


@pytest.mark.sandbox
def test_workers_keep_spare_children_forked_ahead():
  with SandboxPool("gvisor", 1, spare_envs=2, warm_spare=False) as pool:
    # Spares are forked between requests, one at a time: poll until full.
    for _ in range(100):
      stats = pool.stats()[0]
      if stats["spare_envs"] == 2:
        break
      time.sleep(0.1)
    assert stats["spare_envs"] == 2 and stats["envs"] == 0
    created = stats["created"]
    handles = [pool.create(GAME), pool.create(GAME), pool.create(TOOL_USE)]
    # Two programs, three episodes: both processes came from the spares, so
    # every fork since then is a refill (forking for the creates would have
    # counted more), and the second GAME episode joined the first's process.
    stats = pool.stats()[0]
    assert (stats["envs"], stats["programs"]) == (3, 2)
    assert stats["created"] - created == stats["spare_envs"]
    for h in handles[:2]:
      assert pool.reset(h, 1)[0].startswith("Guess a digit")
    for h in handles:
      pool.close_env(h)
    assert pool.stats()[0]["programs"] == 0
  with pytest.raises(SandboxError, match="spare_envs"):
    SandboxPool("gvisor", 1, spare_envs=-1)


@pytest.mark.sandbox
def test_create_errors_carry_the_loader_reason(gvisor_pool):
  live = gvisor_pool.num_envs
  with pytest.raises(SandboxError) as e:
    gvisor_pool.create("class BrokenEnv(:\n  pass")
  assert e.value.reason == "syntax"
  with pytest.raises(SandboxError) as e:
    gvisor_pool.create("x = 1")
  assert e.value.reason == "no_env_class"
  with pytest.raises(SandboxError) as e:
    gvisor_pool.create(PROBE.replace("self.kwargs = kwargs", "1 / 0"))
  assert e.value.reason == "exception" and "ZeroDivisionError" in str(e.value)
  assert gvisor_pool.num_envs == live
  assert_pool_works(gvisor_pool)


@pytest.mark.sandbox
def test_validate_in_parallel_never_raises(gvisor_pool):
  verdicts = gvisor_pool.validate(
      [
          GAME,
          "class X(:",
          "while True:\n  pass",
          SEGFAULT,
          TOOL_USE,
      ]
  )
  assert [v["valid"] for v in verdicts] == [True, False, False, False, True]
  assert verdicts[0]["class_name"] == "GuessEnv" and verdicts[0]["has_hint"]
  assert verdicts[1]["reason"] == "syntax"
  assert verdicts[2]["reason"] == "timeout"
  assert verdicts[3]["reason"] == "crash", verdicts[3]
  assert "SIGSEGV" in verdicts[3]["message"]
  assert verdicts[4]["solution_text"].startswith("lookup(apple)")
  for v in verdicts:
    assert set(v) >= {"valid", "reason", "message", "has_hint", "hint"}
  assert_pool_works(gvisor_pool)


@pytest.mark.sandbox
def test_validate_deadline_bounds_a_hang(gvisor_pool):
  # A C-level hang escapes the validator's own alarm: the worker kills it.
  verdict = gvisor_pool.validate(
      ["import itertools\nsum(itertools.repeat(1))\nclass AEnv: pass"]
  )[0]
  assert verdict["valid"] is False and verdict["reason"] == "timeout"
  assert "deadline" in verdict["message"] or "time" in verdict["message"]
  assert VALIDATE_TIMEOUT_S > 0


@pytest.mark.sandbox
def test_run_code(gvisor_pool):
  ok = gvisor_pool.run_code(
      "def add(a, b):\n  return a + b\nassert add(2, 3) == 5\nprint('pass')",
      5.0,
  )
  assert ok["ok"] and ok["exit_code"] == 0 and ok["stdout"] == "pass\n"
  failed = gvisor_pool.run_code("assert 1 + 1 == 3, 'math'", 5.0)
  assert failed["ok"] is False and failed["exit_code"] == 1
  assert "AssertionError: math" in failed["stderr"]
  assert failed["reason"] == "exit"
  hung = gvisor_pool.run_code("while True:\n  pass", 1.0)
  assert hung["ok"] is False and hung["exit_code"] is None
  assert hung["reason"] == "timeout"


def test_missing_runsc_says_how_to_install(tmp_path):
  with pytest.raises(SandboxError) as e:
    SandboxPool("gvisor", 1, runsc_path=str(tmp_path / "no-runsc"))
  assert e.value.reason == "not_installed"
  assert "apt-get install runsc" in e.value.message
  assert "bwrap" in e.value.message
  with pytest.raises(SandboxError) as e:
    SandboxPool("docker", 1)
  assert e.value.reason == "config" and "gvisor" in e.value.message


def test_config_default_is_gvisor_and_from_config_builds_a_pool():
  config = config_lib.base_config()
  assert config.sandbox.backend == "gvisor"
  config.sandbox.backend = "none"
  config.sandbox.num_sandboxes = 1
  config.sandbox.preload = ()
  config.sandbox.warm_spare = False
  config_lib.validate(config)
  with sandboxes.from_config(config.sandbox) as pool:
    assert pool.options.backend == "none" and pool.options.num_sandboxes == 1
    assert probe(pool, "result = 6 * 7")["obs"] == "42"


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bubblewrap")
def test_bwrap_backend_isolates_uids_and_network():
  with SandboxPool("bwrap", 1, preload=(), warm_spare=False) as pool:
    out = probe(
        pool,
        "import os, socket\ns = socket.socket()\ntry:\n"
        "  s.connect(('8.8.8.8', 53)); net = 'open'\n"
        "except OSError:\n  net = 'blocked'\n"
        "result = (os.getuid(), net, os.path.exists('/work/main/setup.py'))",
    )
    uid, net, host_file = eval(out["obs"])  # pylint: disable=eval-used
    assert uid >= 10000 and net == "blocked" and host_file is False
    assert_pool_works(pool)
