"""Containment: what hostile environment code tries, and that it fails.

Each test gives a verdict on one attack and then checks that the shared pool
still works (`assert_pool_works`), since a defence that breaks the pool is a
denial of service.
"""

import json
import os
import socket
import time

import pytest

from tests.sandbox.conftest import PROBE
from tests.sandbox.conftest import CALL_TIMEOUT_S
from tests.sandbox.conftest import assert_pool_works
from tests.sandbox.conftest import host_processes
from tests.sandbox.conftest import probe
from tests.sandbox.conftest import processes
from tests.sandbox.conftest import program

pytestmark = pytest.mark.sandbox


def _connect_code(host, port):
  return f"""
import socket
s = socket.socket()
s.settimeout(1.0)
try:
  s.connect(({host!r}, {port}))
  result = "connected"
except OSError as e:
  result = "blocked: " + type(e).__name__
"""


def test_network_is_unreachable(gvisor_pool):
  listener = socket.socket()
  listener.bind(("127.0.0.1", 0))
  listener.listen(1)
  listener.settimeout(0.2)
  port = listener.getsockname()[1]
  try:
    local = probe(gvisor_pool, _connect_code("127.0.0.1", port))
    outside = probe(gvisor_pool, _connect_code("8.8.8.8", 53))
    dns = probe(
        gvisor_pool,
        "import socket\ntry:\n  result = socket.gethostbyname('pypi.org')\n"
        "except OSError as e:\n  result = 'blocked: ' + type(e).__name__",
    )
    with pytest.raises(socket.timeout):
      listener.accept()  # nothing ever reached the host's listener
  finally:
    listener.close()
  assert local["ok"] and local["obs"].startswith("blocked"), local
  assert outside["ok"] and outside["obs"].startswith("blocked"), outside
  assert dns["ok"] and dns["obs"].startswith("blocked"), dns
  assert_pool_works(gvisor_pool)


def test_host_files_invisible_and_root_read_only(gvisor_pool):
  code = """
import os, sys
def tries(path):
  try:
    with open(path, "w") as f:
      f.write("x")
    return "written"
  except OSError as e:
    return type(e).__name__
result = repr({
    "setup_py": os.path.exists("/work/main/setup.py"),
    "etc_passwd": os.path.exists("/etc/passwd"),
    "root": sorted(os.listdir("/root")),
    "top": sorted(os.listdir("/")),
    "write_usr": tries("/usr/lib/spade-was-here"),
    "write_top": tries("/spade-was-here"),
    "write_prefix": tries(sys.base_prefix + "/spade-was-here"),
    "write_spade": tries("/opt/spade/spade/was-here"),
    "uid": os.getuid(),
})
"""
  out = probe(gvisor_pool, code)
  assert out["ok"], out
  seen = eval(out["obs"])  # pylint: disable=eval-used
  assert seen["setup_py"] is False
  assert seen["etc_passwd"] is False
  assert seen["root"] == [".pyenv"] or seen["root"] == []
  assert "work" not in seen["top"] and "home" not in seen["top"]
  for key in ("write_usr", "write_top", "write_prefix", "write_spade"):
    assert seen[key] in ("OSError", "PermissionError"), (key, seen[key])
  assert seen["uid"] >= 10000
  assert not os.path.exists("/usr/lib/spade-was-here")
  assert_pool_works(gvisor_pool)


def test_nothing_written_by_one_program_is_visible_to_another(gvisor_pool):
  # (The episodes of one program share its process and directory; the
  # validator refuses file access in valid programs.)
  first, out = probe(
      gvisor_pool,
      """
import os
with open("secret.txt", "w") as f:
  f.write("from the first environment")
def tries(path):
  try:
    open(path, "w").write("x")
    return "written"
  except OSError as e:
    return type(e).__name__
result = repr((os.getcwd(), tries("/tmp/shared.txt"), tries("/dev/shm/x")))
""",
      keep=True,
  )
  assert out["ok"], out
  home, shared_tmp, shared_shm = eval(out["obs"])  # pylint: disable=eval-used
  assert shared_tmp == "PermissionError"
  assert shared_shm in ("PermissionError", "FileNotFoundError")
  steal = f"""
import os
def tries(fn):
  try:
    return repr(fn())
  except OSError as e:
    return type(e).__name__
result = repr((
    tries(lambda: open({home!r} + "/secret.txt").read()),
    tries(lambda: os.listdir("/tmp")),
    tries(lambda: os.listdir(".")),
))
"""
  # While the first environment lives (same sandbox or not) ...
  thieves = [program(f"thief{i}") for i in range(2)]
  during = [probe(gvisor_pool, steal, source=t) for t in thieves]
  gvisor_pool.close_env(first)
  # ... and after it is gone.
  after = [probe(gvisor_pool, steal, source=t) for t in thieves + [PROBE]]
  for r in during + after:
    assert r["ok"], r
    read, listing, own = eval(r["obs"])  # pylint: disable=eval-used
    assert read in ("PermissionError", "FileNotFoundError"), read
    assert listing == "PermissionError"
    assert own == "[]"
  assert_pool_works(gvisor_pool)


@pytest.mark.parametrize(
    "loop, stopped_by",
    [
        ("while True:\n  pass", f"past its {CALL_TIMEOUT_S} s limit"),
        (
            "import itertools\nsum(itertools.repeat(1))",
            "did not yield to its timer; the program's process was killed",
        ),
    ],
    ids=["python_loop", "c_loop"],
)
def test_infinite_loops_stopped_at_the_call_budget(
    gvisor_pool, loop, stopped_by
):
  handle = gvisor_pool.create(PROBE)
  gvisor_pool.reset(handle, 0)
  before = gvisor_pool.stats()
  out = gvisor_pool.step(handle, loop)
  assert out == {
      "ok": False,
      "reason": "call_timeout",
      "message": out["message"],
  }
  # The call budget stopped it, not the host's deadline ("sandbox_lost"):
  # the Python loop by the program's timer (or the worker), the C loop
  # (which never yields to the timer) by the worker killing the process.
  assert stopped_by in out["message"], out
  # No sandbox was replaced, and the episode is over.
  assert [s["name"] for s in gvisor_pool.stats()] == [s["name"] for s in before]
  again = gvisor_pool.step(handle, "result = 1")
  assert again["ok"] is False and again["reason"] == "call_timeout"
  gvisor_pool.close_env(handle)
  assert processes(gvisor_pool) == [1, 1]
  assert_pool_works(gvisor_pool)


def _mem_available():
  with open("/proc/meminfo") as f:
    for line in f:
      if line.startswith("MemAvailable:"):
        return int(line.split()[1]) * 1024
  raise AssertionError("no MemAvailable")


def test_gradual_memory_bomb_stopped(gvisor_pool):
  host_before = _mem_available()
  out = probe(
      gvisor_pool,
      "chunks = []\nwhile True:\n  chunks.append(bytearray(16 << 20))",
  )
  # The address-space limit (1 GiB) stops it with a MemoryError inside the
  # env, or the per-call budget stops it first.
  assert out["ok"] is False, out
  assert out["reason"] in ("memory", "call_timeout"), out
  # One big request hits the limit at once.
  big = probe(gvisor_pool, "x = bytearray(2 << 30)")
  assert big["ok"] is False and big["reason"] == "memory", big
  assert "MemoryError" in big["message"]
  # The host gave the bomb at most its limit (plus slack for the rest of the
  # machine), never the gigabytes it asked for.
  limit = gvisor_pool.options.memory_mb << 20
  assert _mem_available() > host_before - limit - (768 << 20)
  assert_pool_works(gvisor_pool)


def test_fork_bomb_contained(gvisor_pool):
  out = probe(
      gvisor_pool,
      """
import os
while True:
  try:
    os.fork()
  except OSError:
    pass
""",
  )
  assert out["ok"] is False and out["reason"] == "call_timeout", out
  # Every process of the bomb's uid is gone (the kill is asynchronous: give
  # a loaded machine some seconds; 15 were too few beside a training run);
  # the sandboxes have only their workers, and their host task counts stay
  # bounded.
  deadline = time.time() + 45
  while processes(gvisor_pool) != [1, 1] and time.time() < deadline:
    time.sleep(0.2)
  assert processes(gvisor_pool) == [1, 1]
  for s in gvisor_pool.stats():
    assert s["host_tasks"] < gvisor_pool.options.max_host_tasks
  assert_pool_works(gvisor_pool)


def test_gigabytes_of_output_capped(gvisor_pool):
  # Printed output goes nowhere (2 GiB in the step below) ...
  printed = probe(
      gvisor_pool,
      "import sys\nfor _ in range(2048):\n  sys.stdout.write('x' * (1 << 20))"
      "\nresult = 'printed'",
  )
  assert printed["ok"] is False or printed["obs"] == "printed"
  if not printed["ok"]:
    assert printed["reason"] == "call_timeout"
  # ... a huge observation (32 x the 256 KiB cap of a call's result; small
  # enough to build well inside the 0.5 s call limit on a loaded machine,
  # where 64 MiB once took 0.56 s) is refused, not shipped ...
  assert gvisor_pool.options.call_output_cap_bytes == 256 << 10
  huge = probe(gvisor_pool, "result = 'x' * (8 << 20)")
  assert huge["ok"] is False and huge["reason"] == "output_too_large", huge
  # ... and a program's captured stdout/stderr keep only the cap.
  run = gvisor_pool.run_code(
      "import sys\nfor _ in range(1024):\n  sys.stdout.write('y' * (1 << 20))"
      "\n  sys.stderr.write('z' * (1 << 20))",
      timeout_s=3.0,
  )
  assert 0 < len(run["stdout"]) <= gvisor_pool.options.output_cap_bytes
  assert len(run["stderr"]) <= gvisor_pool.options.output_cap_bytes
  assert set(run["stdout"]) == {"y"}
  assert_pool_works(gvisor_pool)


def test_exit_and_segfault_reported_as_crashes(gvisor_pool):
  exited, out = probe(gvisor_pool, "import os\nos._exit(3)", keep=True)
  assert out["ok"] is False and out["reason"] == "crash", out
  assert "exited with code 3" in out["message"]
  after = gvisor_pool.step(exited, "result = 1")
  assert after["ok"] is False and after["reason"] == "crash"
  gvisor_pool.close_env(exited)
  segv = probe(gvisor_pool, "import ctypes\nctypes.string_at(0)")
  assert segv["ok"] is False and segv["reason"] == "crash", segv
  assert "SIGSEGV" in segv["message"]
  assert_pool_works(gvisor_pool)


def test_fake_protocol_lines_cannot_forge_a_result(gvisor_pool):
  forged = {
      "ok": True,
      "obs": "FORGED",
      "reward": 1.0,
      "terminated": True,
      "truncated": False,
      "info": {},
  }
  line = json.dumps({"id": 1, "results": [forged] * 8}) + "\n"
  frame = json.dumps(forged).encode()
  code = f"""
import os, struct, sys
line = {line!r}
frame = {frame!r}
print(line * 3)
sys.__stdout__.write(line)
os.write(1, line.encode())
os.write(2, line.encode())
for fd in range(3, 256):
  try:
    os.write(fd, line.encode())
    os.write(fd, struct.pack(">I", len(frame)) + frame)
  except OSError:
    pass
result = "genuine"
"""
  # Another program: the attacker's own program's episodes share its fate.
  bystander = gvisor_pool.create(program("bystander"))
  attacker = gvisor_pool.create(PROBE)
  gvisor_pool.reset(bystander, 0)
  gvisor_pool.reset(attacker, 0)
  out = gvisor_pool.step_many(
      [(attacker, code), (bystander, "result = 'honest'")] * 2
  )
  for r in out:
    assert r.get("obs") != "FORGED" and r.get("reward") != 1.0, r
  assert out[1]["obs"] == out[3]["obs"] == "honest"
  # The attacker wrote on its own result pipe: it is cut off, not believed.
  assert out[0]["ok"] is False, out[0]
  assert out[0]["reason"] in ("protocol", "output_too_large", "bad_result")
  gvisor_pool.close_env(attacker)
  gvisor_pool.close_env(bystander)
  assert_pool_works(gvisor_pool)


def test_env_cannot_kill_the_worker(gvisor_pool):
  names = [s["name"] for s in gvisor_pool.stats()]
  neighbours = [gvisor_pool.create(program(f"n{i}")) for i in range(2)]
  for h in neighbours:
    gvisor_pool.reset(h, 0)
  out = probe(
      gvisor_pool,
      """
import os, signal
denied = []
for pid in (1, -1, 0, os.getppid()):
  for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP):
    try:
      os.kill(pid, sig)
    except OSError as e:
      denied.append(type(e).__name__)
try:
  os.killpg(1, signal.SIGKILL)
except OSError as e:
  denied.append(type(e).__name__)
result = ",".join(sorted(set(denied)))
""",
  )
  # kill(0) / kill(-1) reach only the caller's own uid: it may kill itself.
  assert out["ok"] or out["reason"] == "crash", out
  assert [s["name"] for s in gvisor_pool.stats()] == names
  for h in neighbours:
    r = gvisor_pool.step(h, "result = 'alive'")
    assert r["obs"] == "alive", r
    gvisor_pool.close_env(h)
  assert_pool_works(gvisor_pool)


@pytest.mark.slow
def test_hundreds_of_create_close_cycles_leave_nothing(gvisor_pool):
  # 300 cycles (150 per sandbox): a process, directory or thread left behind
  # by each cycle would be hundreds over the bounds checked below.
  for i in range(300):
    h = gvisor_pool.create(PROBE)
    if i % 10 == 0:
      gvisor_pool.reset(h, i)
      out = gvisor_pool.step(h, "open('f', 'w').write('x' * 1000)")
      assert out["ok"], out
    gvisor_pool.close_env(h)
  # Inside: only the workers and their spare children (one directory each),
  # no other environment directory, no environment. A closed process exits
  # and a spare is forked asynchronously: on a loaded machine (the suite at
  # nice 19 beside a training run) one was still counted, so wait for them.
  deadline = time.monotonic() + 30
  stats = gvisor_pool.stats()
  while time.monotonic() < deadline and any(
      s["processes"] - s["spare_envs"] != 1 for s in stats
  ):
    time.sleep(0.2)
    stats = gvisor_pool.stats()
  assert [s["processes"] - s["spare_envs"] for s in stats] == [1] * len(stats)
  assert [s["tmp_entries"] - s["spare_envs"] for s in stats] == [0] * len(stats)
  assert [s["envs"] for s in stats] == [0] * len(stats)
  # Host: recycled sandboxes are gone; what is left is the live sandboxes,
  # the warm spare, and their runsc processes (sandbox + gofer each).
  live = len(stats) + 1
  deadline = time.monotonic() + 30
  while time.monotonic() < deadline:
    dirs = [d for d in os.listdir(gvisor_pool.tmpdir) if d.startswith("sb")]
    procs = host_processes(gvisor_pool.tmpdir)
    if len(dirs) <= live and len(procs) <= 2 * live:
      break
    time.sleep(0.2)
  assert len(dirs) <= live, dirs
  assert len(procs) <= 2 * live, procs
  for s in stats:
    assert s["host_tasks"] < gvisor_pool.options.max_host_tasks
  assert_pool_works(gvisor_pool)
