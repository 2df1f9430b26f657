"""Shared sandbox pool and probe programs for the sandbox tests.

Starting a gVisor sandbox with numpy and math_verify preloaded takes seconds,
so the tests of this package share one pool; every test leaves it working and
checks that it does.
"""

import os

import pytest

from spade.sandbox import SandboxPool

# Runs each action as Python and reports the variable `result`: one program
# lets a test try anything from inside an environment.
PROBE = '''
class ProbeEnv:
  """Runs the action as Python and reports `result` as the observation."""

  def __init__(self, max_turns=100, **kwargs):
    self.kwargs = kwargs

  def reset(self, seed=None):
    return "ready", {"seed": seed, "kwargs": self.kwargs}

  def step(self, action):
    scope = {}
    exec(action, scope)
    return str(scope.get("result")), 0.0, False, False, {}

  def hint(self):
    return "read the source"
'''


def program(tag):
  """PROBE as a distinct program: the episodes of one program share a
  process, different programs never do."""
  return PROBE + f"\n# program {tag}\n"


STEP_TIMEOUT_S = 2.0
CALL_TIMEOUT_S = 0.5
VALIDATE_TIMEOUT_S = 8.0


def probe(pool, code, *, keep=False, source=PROBE):
  """Creates a probe environment, runs `code` in it; returns the result."""
  handle = pool.create(source)
  pool.reset(handle, 0)
  result = pool.step(handle, code)
  if keep:
    return handle, result
  pool.close_env(handle)
  return result


def assert_pool_works(pool):
  """The pool still creates, steps and closes environments correctly."""
  handles = [pool.create(PROBE) for _ in range(2 * pool.options.num_sandboxes)]
  for h in handles:
    assert pool.reset(h, 1)[0] == "ready"
  out = pool.step_many(
      [(h, f"result = {i} * 7") for i, h in enumerate(handles)]
  )
  assert [r["obs"] for r in out] == [str(i * 7) for i in range(len(handles))]
  for h in handles:
    pool.close_env(h)


def host_processes(tmpdir):
  """Host processes whose command line names a pool's directory."""
  found = []
  for pid in os.listdir("/proc"):
    if not pid.isdigit():
      continue
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        if tmpdir.encode() in f.read():
          found.append(int(pid))
    except OSError:
      pass
  return found


def processes(pool):
  """Processes inside each sandbox (the worker alone is 1).

  The environment children a worker keeps forked ahead (`spare_envs`) wait
  for a program and are not counted.
  """
  return [s["processes"] - s["spare_envs"] for s in pool.stats()]


@pytest.fixture(scope="package")
def gvisor_pool():
  """Two gVisor sandboxes shared by this package's tests."""
  with SandboxPool(
      "gvisor",
      2,
      step_timeout_s=STEP_TIMEOUT_S,
      call_timeout_s=CALL_TIMEOUT_S,
      validate_timeout_s=VALIDATE_TIMEOUT_S,
      host_grace_s=3.0,
  ) as pool:
    yield pool
