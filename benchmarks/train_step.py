r"""Throughput and model-FLOPs utilisation of the jitted update step.

  python benchmarks/train_step.py
  python benchmarks/train_step.py --rows=tiny:8x128,tiny:32x512 --steps=5
  python benchmarks/train_step.py --devices=2   # one CPU device per core
  python benchmarks/train_step.py --memory      # Qwen 0.5B update's peak RSS

Each row times `spade.train.update.make_update_step` (designer and agent
sub-batches of B x L tokens each, both through the shared trunk) on one device
(or --devices) after one warm-up call, as the best of --steps calls, and
prints tokens/s and MFU: model FLOPs per second over a measured matmul peak
(the best of several large float32 `jnp.dot`s on the same device, measured
before and after the rows). Best-of on both sides keeps a shared machine's
load out of the ratio as far as it can. Model FLOPs count what the step
computes: 3x the forward (forward + backward), matmuls 2 * params * tokens
(the unembedding included, the embedding lookup not) plus attention 4 * L *
heads * head_dim per token and layer (dense: the causal mask is applied to a
full score matrix). The last line is key=value pairs for the first row.

`--devices=N` runs the step data-parallel over a mesh of N devices (on a CPU,
N host devices made with `--xla_force_host_platform_device_count`, which this
script sets before JAX starts). On this 2-core machine XLA's CPU backend
splits a single device's small element-wise ops over both threads, and the
hand-offs cost more than they save; one device per core keeps every op on
its core, with the rows split between them.

`--memory` instead runs one update of Qwen2.5-Coder-0.5B-Instruct's shapes
as `configs/qwen2p5_coder_0p5b.py` sets them up (remat policy, micro-batches,
scoring chunk; `--remat` overrides the policy) on designer and agent
sub-batches of --memory_rows (default 2 x 2048 tokens each), and prints the
process's peak resident memory (`ru_maxrss`: parameters, Adam state,
gradients, XLA's temporaries and the compiler together). The weights are a
scratch init of the same shapes: memory does not depend on their values, and
no checkpoint is loaded. Its last line holds `peak_rss_gib=`.
"""

from __future__ import annotations

import importlib.util
import os
import resource
import sys
import time


def _devices_from_argv() -> int:
  for arg in sys.argv[1:]:
    if arg.startswith("--devices="):
      return int(arg.split("=", 1)[1])
  return 1


# Host devices must exist before JAX starts: read --devices ahead of absl.
if _devices_from_argv() > 1 and "host_platform_device_count" not in (
    os.environ.get("XLA_FLAGS", "")
):
  os.environ["XLA_FLAGS"] = (
      os.environ.get("XLA_FLAGS", "")
      + f" --xla_force_host_platform_device_count={_devices_from_argv()}"
  )

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from spade import config as config_lib
from spade import console
from spade.model import sharding
from spade.model import transformer
from spade.train import state as state_lib
from spade.train import update

_ROWS = flags.DEFINE_string(
    "rows",
    "tiny:8x128,tiny:64x32,medium:8x256",
    "Comma-separated model:BxL; models: tiny (config defaults), medium.",
)
_STEPS = flags.DEFINE_integer("steps", 5, "Timed steps per row.")
_PEAK_N = flags.DEFINE_integer("peak_n", 2048, "Matmul size for the peak.")
_DEVICES = flags.DEFINE_integer(
    "devices", 1, "Devices of the data-parallel mesh (rows split over them)."
)
_MEMORY = flags.DEFINE_bool(
    "memory", False, "Peak resident memory of one Qwen 0.5B update instead."
)
_MEMORY_ROWS = flags.DEFINE_string(
    "memory_rows", "2x2048", "BxL of each role's sub-batch with --memory."
)
_REMAT = flags.DEFINE_string(
    "remat", "", "With --memory: config.model.remat (default: the config's)."
)
_LORA_RANK = flags.DEFINE_integer(
    "lora_rank", -1,
    "With --memory: config.optim.lora_rank (-1: the config's; 0: full"
    " fine-tuning; 32: the reference's Tinker adapters).",
)  # fmt: skip

# A bigger model that still steps in seconds on a 2-core CPU.
_MEDIUM = dict(
    embed_dim=512, num_layers=4, num_heads=8, num_kv_heads=4, head_dim=64,
    mlp_dim=2048,
)  # fmt: skip


def matmul_peak(n: int, repeats: int = 5) -> float:
  """Best float32 FLOP/s of an n x n x n jnp.dot on the default device."""
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32)
  dot = jax.jit(jnp.dot)
  dot(a, b).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    dot(a, b).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2 * n**3 / best


def train_flops_per_token(m, length: int) -> float:
  """Forward + backward FLOPs per token of the model config `m`."""
  attn = m.embed_dim * m.head_dim * (2 * m.num_heads + 2 * m.num_kv_heads)
  mlp = 3 * m.embed_dim * m.mlp_dim
  matmul = m.num_layers * (attn + mlp) + m.vocab_size * m.embed_dim
  scores = m.num_layers * 4 * length * m.num_heads * m.head_dim
  return 3 * (2 * matmul + scores)


def _batch(rows: int, length: int, vocab: int, rng) -> dict:
  loss_mask = np.zeros((rows, length), bool)
  loss_mask[:, length // 2 :] = True  # prompt, then the sampled completion
  return {
      "tokens": rng.integers(0, min(vocab, 256), (rows, length), np.int32),
      "input_mask": np.ones((rows, length), bool),
      "loss_mask": loss_mask,
      "old_logprobs": np.full((rows, length), -np.log(vocab), np.float32),
      "advantages": rng.normal(size=rows).astype(np.float32),
      "weights": np.ones(rows, np.float32),
  }


def time_row(
    model_name: str, rows: int, length: int, steps: int, devices: int = 1
) -> dict:
  """Times the update step for one model and batch shape."""
  c = config_lib.base_config()
  if model_name == "medium":
    c.model.update(_MEDIUM)
  elif model_name != "tiny":
    raise ValueError(f"unknown model {model_name!r}: use tiny or medium")
  c.model.max_len = max(c.model.max_len, length)
  if jax.device_count() < devices or rows % devices:
    raise ValueError(
        f"--devices={devices}: {jax.device_count()} devices available and"
        f" {rows} rows; the rows must split evenly over the devices"
    )
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = devices, 1, 1
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:devices])
  model = transformer.build_model(c.model)
  optimizer = state_lib.make_optimizer(c.optim)
  params = transformer.init_params(c.model, jax.random.PRNGKey(0))
  state = state_lib.create_state(
      params, optimizer, rng=jax.random.PRNGKey(1), mesh=mesh,
      rules=c.mesh.rules,
  )  # fmt: skip
  step = update.make_update_step(model, optimizer, mesh, c)
  rng = np.random.default_rng(0)
  batch = {
      "designer": _batch(rows, length, c.model.vocab_size, rng),
      "agent": _batch(rows, length, c.model.vocab_size, rng),
  }
  t = time.perf_counter()
  state, metrics = step(state, batch)
  jax.block_until_ready(metrics)
  compile_s = time.perf_counter() - t
  times = []
  for _ in range(steps):
    t = time.perf_counter()
    state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - t)
  # The best time, like the peak's: on a shared machine both then measure
  # the least-disturbed run rather than the neighbours' load.
  step_s = float(np.min(times))
  tokens = 2 * rows * length
  n_params = sum(x.size for x in jax.tree.leaves(params))
  flops = tokens * train_flops_per_token(c.model, length)
  return dict(
      model=model_name,
      params=n_params,
      batch=rows,
      length=length,
      compile_s=compile_s,
      step_s=step_s,
      median_step_s=float(np.median(times)),
      train_tokens_s=tokens / step_s,
      model_flops_s=flops / step_s,
  )


def _qwen_config():
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  path = os.path.join(root, "configs", "qwen2p5_coder_0p5b.py")
  spec = importlib.util.spec_from_file_location("qwen_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def peak_memory(
    rows: int, length: int, remat: str = "", lora_rank: int = -1
) -> dict:
  """One Qwen 0.5B update on rows x length per role; peak RSS in GiB."""
  c = _qwen_config()
  c.checkpoint.kind = "scratch"
  if lora_rank >= 0:
    c.optim.lora_rank = lora_rank
  if remat:
    c.model.remat = remat
  c.model.max_len = max(c.model.max_len, length)
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, 1, 1
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  model = transformer.build_model(c.model)
  optimizer = state_lib.make_optimizer(c.optim)
  params = transformer.init_params(c.model, jax.random.PRNGKey(0))
  state = state_lib.create_state(
      params, optimizer, rng=jax.random.PRNGKey(1), mesh=mesh,
      rules=c.mesh.rules, keep_reference=state_lib.keeps_reference(c),
      lora_rank=c.optim.lora_rank,
  )  # fmt: skip
  del params
  step = update.make_update_step(model, optimizer, mesh, c)
  rng = np.random.default_rng(0)
  batch = {
      "designer": _batch(rows, length, c.model.vocab_size, rng),
      "agent": _batch(rows, length, c.model.vocab_size, rng),
  }
  t = time.perf_counter()
  state, metrics = step(state, batch)
  jax.block_until_ready(metrics)
  step_s = time.perf_counter() - t
  n_params = sum(x.size for x in jax.tree.leaves(state.params))
  # ru_maxrss is in KiB on Linux.
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
  return dict(
      params=n_params,
      rows=rows,
      length=length,
      remat=c.model.remat,
      lora_rank=c.optim.lora_rank,
      microbatch_rows=c.optim.microbatch_rows,
      logprob_chunk=c.optim.logprob_chunk,
      loss=float(metrics["train/loss"]),
      first_step_s=step_s,
      peak_rss_gib=peak,
  )


def main(argv):
  console.no_tpu_probe()  # before JAX starts a backend: no libtpu page
  del argv
  if _MEMORY.value:
    rows, length = (int(v) for v in _MEMORY_ROWS.value.split("x"))
    r = peak_memory(rows, length, _REMAT.value, _LORA_RANK.value)
    print(
        f"qwen2.5-coder-0.5b shapes, {r['params']:,} params: designer and"
        f" agent {rows}x{length} each, remat={r['remat']},"
        f" microbatch_rows={r['microbatch_rows']},"
        f" logprob_chunk={r['logprob_chunk']}: first step (with compile)"
        f" {r['first_step_s']:.0f} s, loss {r['loss']:.4f}"
    )
    print(
        f"peak_rss_gib={r['peak_rss_gib']:.2f} rows={rows} length={length}"
        f" remat={r['remat']} microbatch_rows={r['microbatch_rows']}"
        f" lora_rank={r['lora_rank']}"
    )
    return
  peak = matmul_peak(_PEAK_N.value)
  print(
      f"device {jax.devices()[0].device_kind}: float32 matmul peak"
      f" {peak / 1e9:.1f} GFLOP/s ({_PEAK_N.value}^3 jnp.dot)"
  )
  results = []
  for spec in _ROWS.value.split(","):
    name, shape = spec.split(":")
    rows, length = (int(v) for v in shape.split("x"))
    r = time_row(name, rows, length, _STEPS.value, _DEVICES.value)
    r["mfu"] = r["model_flops_s"] / peak
    results.append(r)
    print(
        f"{r['model']:>6} params={r['params']:>9,} B={rows:<3} L={length:<4}"
        f" step={r['step_s'] * 1e3:8.1f} ms (median"
        f" {r['median_step_s'] * 1e3:.1f})  {r['train_tokens_s']:9.0f} tok/s"
        f"  {r['model_flops_s'] / 1e9:6.1f} GFLOP/s  MFU {r['mfu']:.1%}"
        f"  (compile {r['compile_s']:.1f} s)"
    )
  # Measured again after the rows: the higher of the two is the peak.
  later = matmul_peak(_PEAK_N.value)
  if later > peak:
    print(f"matmul peak re-measured: {later / 1e9:.1f} GFLOP/s; MFU rescaled")
    for r in results:
      r["mfu"] = r["model_flops_s"] / later
    peak = later
  first = results[0]
  best = max(results, key=lambda r: r["mfu"])
  print(
      f"train_tokens_s={first['train_tokens_s']:.0f} mfu={first['mfu']:.3f}"
      f" step_ms={first['step_s'] * 1e3:.1f} peak_gflops={peak / 1e9:.1f}"
      f" batch={first['batch']} length={first['length']}"
      f" devices={_DEVICES.value}"
      f" best_mfu={best['mfu']:.3f}"
      f" best_row={best['model']}:{best['batch']}x{best['length']}"
  )


if __name__ == "__main__":
  app.run(main)
