"""Sandbox throughput and latency: steps/s, p50/p99, create, memory.

Runs a trivial environment in pools of 1, 2 and 4 gVisor sandboxes, one
program per sandbox with 8 episodes each (the episodes of a program are
instances in one process), stepping them either one call at a time
(unbatched) or all in one `step_many` (batched); then create+reset latency,
memory per sandbox, memory per concurrent episode (64 episodes: two seed
programs x 32 plays, the reference's plays per environment; and the cost of
one more program process), and the same environment stepped in-process with
no isolation as the upper limit. The last line is key=value pairs.

  python benchmarks/sandbox.py [--backend gvisor] [--seconds 3]
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from spade.sandbox import SandboxPool  # pylint: disable=g-import-not-at-top

TRIVIAL = '''
class EchoEnv:
  """Echoes the action; wins after 1000 steps."""

  def __init__(self, max_turns=1000, **kwargs):
    self.max_turns = max_turns
    self.t = 0

  def reset(self, seed=None):
    self.t = 0
    return "ready", {}

  def step(self, action):
    self.t += 1
    done = self.t >= self.max_turns
    return "echo " + action, 1.0 if done else 0.0, done, False, {}
'''


def _pct(values, q):
  values = sorted(values)
  return values[min(len(values) - 1, int(q * len(values)))]


def _inproc(seconds):
  namespace = {}
  exec(TRIVIAL, namespace)  # pylint: disable=exec-used
  env = namespace["EchoEnv"](max_turns=10**9)
  env.reset(0)
  n, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    for _ in range(1000):
      env.step("a")
    n += 1000
  return n / (time.perf_counter() - start)


def _program(k):
  """TRIVIAL as the k-th distinct program."""
  return TRIVIAL + f"\n# program {k}\n"


def _run(pool, envs_per_sandbox, seconds, batched):
  # One program per sandbox: a program's episodes stay in one sandbox.
  handles = [
      pool.create(_program(k))
      for k in range(pool.options.num_sandboxes)
      for _ in range(envs_per_sandbox)
  ]
  for h in handles:
    pool.reset(h, 0)
  latencies, steps = [], 0
  start = time.perf_counter()
  while time.perf_counter() - start < seconds:
    if batched:
      t = time.perf_counter()
      out = pool.step_many([(h, "a") for h in handles])
      dt = time.perf_counter() - t
      latencies.append(dt)
      steps += len(out)
    else:
      for h in handles:
        t = time.perf_counter()
        pool.step(h, "a")
        latencies.append(time.perf_counter() - t)
        steps += 1
  rate = steps / (time.perf_counter() - start)
  for h in handles:
    pool.close_env(h)
  return rate, _pct(latencies, 0.5) * 1e3, _pct(latencies, 0.99) * 1e3


_SEEDS = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    "spade",
    "environments",
    "seeds",
)


def _settled_pss(pool):
  """The sandbox's PSS (MiB) once its worker has refilled its spares."""
  for _ in range(200):
    stats = pool.stats()[0]
    if stats["spare_envs"] >= pool.options.spare_envs:
      break
    time.sleep(0.1)
  time.sleep(0.5)
  return pool.stats()[0]["rss_bytes"] / 2**20


def _memory_per_episode(backend, programs, plays, distinct):
  """PSS per concurrent episode, and per extra program process (MiB)."""
  with SandboxPool(backend, 1, warm_spare=False) as pool:
    sources = []
    for name in programs:
      with open(os.path.join(_SEEDS, name + ".py")) as f:
        sources.append(f.read())
    base = _settled_pss(pool)
    opened = pool.open_many(
        [
            {"source": src, "seed": k, "calls": ["get_tools"]}
            for src in sources
            for k in range(plays)
        ]
    )
    assert all(o["ok"] for o in opened), opened
    handles = [o["handle"] for o in opened]
    pool.step_many([(h, "\\boxed{1}") for h in handles])
    with_episodes = _settled_pss(pool)
    per_episode = (with_episodes - base) / len(handles)
    for h in handles:
      pool.close_env(h)
    base = _settled_pss(pool)
    handles = [pool.create(_program(k)) for k in range(distinct)]
    per_process = (_settled_pss(pool) - base) / distinct
    for h in handles:
      pool.close_env(h)
    return per_episode, per_process, len(opened)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--backend", default="gvisor")
  parser.add_argument("--seconds", type=float, default=3.0)
  parser.add_argument("--envs-per-sandbox", type=int, default=8)
  parser.add_argument("--sizes", default="1,2,4")
  parser.add_argument("--memory-programs", default="grid_maze,order_lookup")
  parser.add_argument("--memory-plays", type=int, default=32)
  parser.add_argument("--memory-distinct", type=int, default=8)
  args = parser.parse_args()
  figures = {}
  per_episode, per_process, episodes = _memory_per_episode(
      args.backend,
      args.memory_programs.split(","),
      args.memory_plays,
      args.memory_distinct,
  )
  print(
      f"memory (PSS): {per_episode:.2f} MiB per episode with {episodes}"
      f" concurrent episodes of {args.memory_programs}; {per_process:.1f} MiB"
      " per program process"
  )
  for n in [int(s) for s in args.sizes.split(",")]:
    t = time.perf_counter()
    with SandboxPool(args.backend, n, warm_spare=False) as pool:
      print(f"{n} sandbox(es) started in {time.perf_counter() - t:.2f} s")
      for batched in (False, True):
        rate, p50, p99 = _run(
            pool, args.envs_per_sandbox, args.seconds, batched
        )
        kind = "batched" if batched else "unbatched"
        print(
            f"  {kind:9s} {rate:8.0f} steps/s  p50 {p50:6.2f} ms  p99"
            f" {p99:6.2f} ms  ({args.envs_per_sandbox} envs/sandbox)"
        )
        figures[(n, batched)] = (rate, p50, p99)
      if n == 1:
        creates = []
        for _ in range(20):
          t = time.perf_counter()
          h = pool.create(TRIVIAL)
          pool.reset(h, 0)
          creates.append(time.perf_counter() - t)
          pool.close_env(h)
        figures["create_ms"] = statistics.median(creates) * 1e3
        print(f"  create+reset p50 {figures['create_ms']:.1f} ms")
        empty = pool.stats()[0]["rss_bytes"] / 2**20
        hs = [pool.create(TRIVIAL) for _ in range(args.envs_per_sandbox)]
        stats = pool.stats()[0]
        figures["rss_mb"] = stats["rss_bytes"] / 2**20
        figures["empty_mb"] = empty
        print(
            f"  memory (PSS): {empty:.0f} MiB empty, {figures['rss_mb']:.0f}"
            f" MiB with {len(hs)} environments ({stats['host_tasks']} host"
            " tasks)"
        )
        for h in hs:
          pool.close_env(h)
  inproc = _inproc(args.seconds)
  print(f"in-process (no isolation) {inproc:.0f} steps/s")
  best = max(
      (k for k in figures if isinstance(k, tuple) and k[1]),
      key=lambda k: figures[k][0],
  )
  unbatched_1 = figures.get((1, False), (0, 0, 0))
  b = args.backend
  print(
      f"{b}_batched_steps_s={figures[best][0]:.0f}"
      f" {b}_batched_sandboxes={best[0]}"
      f" {b}_unbatched_steps_s={unbatched_1[0]:.0f}"
      f" {b}_p50_ms={unbatched_1[1]:.2f} {b}_p99_ms={unbatched_1[2]:.2f}"
      f" {b}_create_reset_ms={figures.get('create_ms', 0):.1f}"
      f" {b}_mem_mb_empty_sandbox={figures.get('empty_mb', 0):.0f}"
      f" {b}_mem_mb_sandbox_with_envs={figures.get('rss_mb', 0):.0f}"
      f" inproc_steps_s={inproc:.0f}"
      f" pss_mib_per_episode={per_episode:.2f}"
      f" pss_mib_per_program={per_process:.1f}"
  )


if __name__ == "__main__":
  main()
