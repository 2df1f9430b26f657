"""Test harness: 8 fake CPU devices and the `slow` / `sandbox` markers.

XLA reads the device count once, at backend start, so it is set here before
anything imports jax.

One JAX compilation cache serves the whole session: a fresh directory made
by the first process (the xdist controller, before its workers start), read
and written by every worker and every `spade.main` the tests start, and
removed at the end. The tiny model's programs are the same in many tests
(each run of the loop compiles its sampler and update again), so later
compilations are loads. A cache from outside the session is never used:
set SPADE_TEST_JAX_CACHE=0 to compile everything afresh.

XLA compiles the tests' programs with LLVM's optimisation off
(SPADE_TEST_XLA_FLAGS, default `--xla_backend_optimization_level=0`): the
tiny model's programs run for milliseconds and took seconds to optimise,
and the suite spends more time compiling than running. Every comparison a
test makes is between programs compiled the same way. The processes the
tests start (a `spade.main` run, the eval CLI, the notebook's kernel) get
the same flags, with one host device as a user's CPU run has, not the
eight fake ones. SPADE_TEST_XLA_FLAGS= (empty) compiles as a user's run
does.
"""

import itertools
import os
import shutil
import tempfile

os.environ.setdefault(
    "SPADE_TEST_XLA_FLAGS", "--xla_backend_optimization_level=0"
)
os.environ["XLA_FLAGS"] = " ".join(
    [
        os.environ.get("XLA_FLAGS", ""),
        os.environ["SPADE_TEST_XLA_FLAGS"],
        "--xla_force_host_platform_device_count=8",
    ]
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # pylint: disable=g-import-not-at-top


_OWNS_CACHE = False
if os.environ.get("SPADE_TEST_JAX_CACHE", "1") != "0" and not os.environ.get(
    "JAX_COMPILATION_CACHE_DIR"
):
  import filelock  # pylint: disable=g-import-not-at-top,unused-import  # noqa
  # Workers and subprocesses inherit the variable, so only the first
  # process of the session gets here.
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(
      prefix="spade-test-jax-cache-"
  )
  # A size limit makes JAX take a file lock around every read and write
  # (without one it writes entries in place, and a process reading an entry
  # another is still writing would get a truncated program).
  os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"] = str(16 * 2**30)
  # Every program, not only those over JAX's default second of compile: the
  # tiny model's are mostly shorter, and each `spade.main` a test starts
  # compiles them again.
  os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
  _OWNS_CACHE = True


def pytest_unconfigure(config):
  del config
  if _OWNS_CACHE:
    shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)


def pytest_configure(config):
  config.addinivalue_line("markers", "slow: long test (minutes)")
  config.addinivalue_line(
      "markers", "sandbox: needs gVisor's runsc (apt-get install runsc)"
  )


def _spread_slow_tests(items, workers: int):
  """The order `--dist worksteal` balances best: it hands worker i the
  i-th contiguous part of the list (len // (workers - i) of what is left)
  and later steals from the ends of the parts. So every part starts with
  its share of the slow tests (every `workers`-th, round robin) and the
  short ones fill the parts' ends; with the slow tests all at the front of
  the list, one worker would start with all of them."""
  slow = [item for item in items if "slow" in item.keywords]
  fast = iter([item for item in items if "slow" not in item.keywords])
  ordered, left = [], len(items)
  for i in range(workers):
    size = left // (workers - i)
    left -= size
    mine = slow[i::workers]
    ordered += mine + list(itertools.islice(fast, max(0, size - len(mine))))
  ordered += list(fast)
  items[:] = ordered


def pytest_collection_modifyitems(config, items):
  del config
  # Long tests first, so the workers start on them and the short ones fill
  # the end of the run instead of one worker finishing alone.
  items.sort(key=lambda item: "slow" not in item.keywords)
  workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
  if workers > 1:
    _spread_slow_tests(items, workers)
  if shutil.which("runsc"):
    return
  # Without runsc the sandbox tests cannot run; fail loudly under CI rather
  # than pass by skipping, since CI's set-up installs runsc.
  if os.environ.get("CI"):
    return
  skip = pytest.mark.skip(reason="runsc not installed: apt-get install runsc")
  for item in items:
    if "sandbox" in item.keywords:
      item.add_marker(skip)
