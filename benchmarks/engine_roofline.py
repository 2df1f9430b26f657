r"""The slot engine's decode against the memory roofline, on one device.

  python benchmarks/engine_roofline.py --config=configs/gemma3_tpu.py:4b
  python benchmarks/engine_roofline.py --config=configs/tiny.py --calls=4

Builds a config's slot engine (`spade.compile.slot_engine`, as the loop
builds it, one device, no mesh) with random weights at the config's shapes
(nothing is downloaded), fills every slot with a prompt and times its
`generate` calls with every slot live (each timed call is one
`SlotServer.step`: the host's bookkeeping and the tokens' copy to the host
count, as in a rollout). The default slot count is one chip's
share of a pod config's (`sampling.slots` over its batch shards,
`mesh.data` x `mesh.fsdp`, data -1 counted as 1), each slot a
`model.max_len` cache; the weights are the whole model's, as one GPU holds
them.

What a step must read: every weight the step uses once (not the input
embedding's table: a step gathers its rows) and every slot's cache once,
as `spade.compile` counts it. The bound is this device's copy bandwidth,
measured in the same run (a jitted `x + 1` over a 1 GiB buffer, read and
written, best of 5). Figures: generated tokens a second, the bytes a step
must read over a step's time (`achieved_gbs`), and that over the measured
bandwidth (`roofline_frac`). The last line:

  device=... params_gib=... cache_gib=... slots=... steps_per_call=... tok_s=... step_ms=... min_bytes_per_step_mib=... copy_gbs=... achieved_gbs=... roofline_frac=...

Flags that shrink a config for a smaller device or a CPU check:
`--layers`, `--max_len`, `--slots`, `--prompt`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)

from spade import compile as compile_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from spade import config as config_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from spade.model import transformer  # pylint: disable=g-import-not-at-top,wrong-import-position
from spade.sampling import slot_server  # pylint: disable=g-import-not-at-top,wrong-import-position

GIB = 2**30


def copy_bandwidth(gib: float = 1.0, repeats: int = 5) -> float:
  """Bytes a second a jitted `x + 1` moves over a `gib` GiB float32 buffer
  (each element read once and written once), best of `repeats`."""
  n = int(gib * GIB) // 4
  x = jnp.zeros((n,), jnp.float32)
  add = jax.jit(lambda x: x + 1)
  add(x).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    add(x).block_until_ready()
    best = min(best, time.perf_counter() - t0)
  return 2 * n * 4 / best


def tree_bytes(tree) -> int:
  return sum(int(x.size) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def batch_shards(mesh) -> int:
  """A pod config's batch shards: `mesh.data` x `mesh.fsdp`, -1 as 1."""
  return max(mesh.data, 1) * max(mesh.fsdp, 1)


def build(config, slots: int, decode_steps: int):
  """The agent's slot engine (no stop ids: every row runs every step) and
  random parameters at the config's shapes."""
  engine = compile_lib.slot_engine(
      config,
      None,
      None,
      "agent",
      stop_ids=(),
      slots=slots,
      prefill_rows=min(config.sampling.prefill_rows, slots),
      decode_steps=decode_steps or config.sampling.decode_steps,
  )
  params = transformer.init_params(config.model, jax.random.key(0))
  return engine, params


def run(config, slots: int, prompt: int, calls: int, decode_steps: int = 0):
  """What `calls` timed generate calls with every slot live measure (a
  step's median seconds) and what a step must read, after the calls that
  fill the slots and compile the programs."""
  engine, params = build(config, slots, decode_steps)
  n = engine.decode_steps
  if prompt >= engine.cache_length:
    raise SystemExit(
        f"--prompt={prompt} leaves no room in max_len={engine.cache_length}"
    )
  server = slot_server.SlotServer(engine, params)
  rng = np.random.default_rng(0)
  vocab = config.model.vocab_size
  new = engine.cache_length - prompt
  for i in range(slots):
    ids = rng.integers(2, vocab, prompt).tolist()
    server.submit(slot_server.Request(i, ids, new, jax.random.key(i)))
  # Fills every slot (prefill-insert calls, a generate after each) and runs
  # one more generate: both programs compile here.
  while server.queue:
    server.step(early=False)
  server.step(early=False)
  # The first slot filled has made a call's tokens at every step so far.
  if prompt + n * (server.generate_calls + calls) > engine.cache_length:
    raise SystemExit(
        f"{calls} timed calls of {n} steps after {server.generate_calls} do"
        f" not fit max_len={engine.cache_length} with a {prompt}-token"
        " prompt: pass a shorter --prompt or fewer --calls"
    )
  times = []
  for c in range(calls):
    t0 = time.perf_counter()
    server.step(early=False)  # returns once the call's tokens are on host
    times.append(time.perf_counter() - t0)
    print(
        f"call {c + 1}/{calls}: {times[-1] * 1e3:.1f} ms,"
        f" {slots * n / times[-1]:,.0f} tok/s",
        file=sys.stderr,
        flush=True,
    )
  assert server.live == slots, "a row ended during the timed calls"
  return {
      "params_bytes": tree_bytes(server.params),
      "cache_bytes": tree_bytes(server.state["cache"]),
      # What a step must read: every weight but the lookup table, once,
      # and every slot's cache, once.
      "min_bytes_per_step": (
          tree_bytes(server.params)
          - tree_bytes(server.params.get("embedder", {}))
          + tree_bytes(server.state["cache"])
      ),
      "slots": slots,
      "steps_per_call": n,
      "step_s": float(np.median(times)) / n,
  }


def figures(measured: dict, bandwidth: float) -> dict[str, str]:
  """The printed figures of `run`'s measurements, against `bandwidth`
  (bytes a second)."""
  step = measured["step_s"]
  achieved = measured["min_bytes_per_step"] / step
  return {
      "params_gib": f"{measured['params_bytes'] / GIB:.2f}",
      "cache_gib": f"{measured['cache_bytes'] / GIB:.2f}",
      "slots": str(measured["slots"]),
      "steps_per_call": str(measured["steps_per_call"]),
      "tok_s": f"{measured['slots'] / step:.1f}",
      "step_ms": f"{step * 1e3:.4g}",
      "min_bytes_per_step_mib": f"{measured['min_bytes_per_step'] / 2**20:.2f}",
      "copy_gbs": f"{bandwidth / 1e9:.1f}",
      "achieved_gbs": f"{achieved / 1e9:.2f}",
      "roofline_frac": f"{achieved / bandwidth:.3f}",
  }


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="configs/gemma3_tpu.py:4b")
  parser.add_argument(
      "--slots", type=int, default=0,
      help="slots (0: sampling.slots over the config's batch shards)",
  )  # fmt: skip
  parser.add_argument(
      "--prompt", type=int, default=0,
      help="prompt tokens a slot (0: half of max_len)",
  )  # fmt: skip
  parser.add_argument("--calls", type=int, default=8)
  parser.add_argument(
      "--decode_steps", type=int, default=0,
      help="steps a generate call (0: sampling.decode_steps)",
  )  # fmt: skip
  parser.add_argument("--layers", type=int, default=0, help="0: the config's")
  parser.add_argument(
      "--max_len", type=int, default=0, help="cache length (0: the config's)"
  )
  parser.add_argument(
      "--copy_gib", type=float, default=1.0,
      help="the bandwidth probe's buffer",
  )  # fmt: skip
  args = parser.parse_args(argv)
  config = config_lib.load_file(args.config, _ROOT)
  if args.layers:
    config.model.num_layers = args.layers
  if args.max_len:
    config.model.max_len = args.max_len
  slots = args.slots or max(
      config.sampling.slots // batch_shards(config.mesh), 1
  )
  prompt = args.prompt or config.model.max_len // 2
  device = jax.devices()[0]
  print(
      f"{args.config} on {device.device_kind}: {slots} slots x"
      f" {config.model.max_len} cache, {config.model.num_layers} layers",
      file=sys.stderr,
      flush=True,
  )
  bandwidth = copy_bandwidth(args.copy_gib)
  measured = run(config, slots, prompt, args.calls, args.decode_steps)
  kind = device.device_kind.replace(" ", "_")
  pairs = {"device": kind, **figures(measured, bandwidth)}
  print(" ".join(f"{k}={v}" for k, v in pairs.items()))


if __name__ == "__main__":
  main()
