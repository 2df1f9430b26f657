r"""Decode speed of a real model on this CPU, against the weight-streaming bound.

  python benchmarks/cpu_decode.py                            # Qwen 0.5B
  python benchmarks/cpu_decode.py --config=configs/qwen2p5_coder_1p5b.py
  python benchmarks/cpu_decode.py --rows=2,8 --tokens=48

Loads `--config`'s checkpoint once and decodes greedily with the compiled
sampler (`spade.sampling.sampler.Sampler`, the designer head) under each
weight representation of `--variants`:

  in_out     float32 weights stored [in, out] (`model.kernel_layout`),
             float32 activations
  out_in     float32 weights stored [out, in] (the CPU configs' layout)
  bf16       bfloat16 weights [in, out], float32 activations
             (`model.param_dtype`)
  bf16_all   bfloat16 weights [in, out] and activations (`model.dtype` too)

Decode time is measured alone: each call's time minus a one-token call's
time (its prefill), over `--tokens - 1` steps, best of `--repeats`. The
bound is this machine's read bandwidth, measured in the same run (numpy
summing a 1 GiB float32 array, best of 3), over the bytes one step must
read: every weight except the input embedding (a step gathers `rows` of it)
and, with `model.separate_heads`, the other role's output layer. Each
variant's greedy tokens on the parity prompts
(`tests/model/reference_outputs.json`, transformers' greedy continuation of
the same file) are compared with the first variant's. The last line:

  model=... read_gbs=... <variant>_rows<R>_tok_s=... <variant>_rows<R>_bound_frac=... <variant>_parity=...
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from spade import config as config_lib
from spade import console
from spade.model import layers
from spade.model import loading
from spade.model import transformer
from spade.sampling import sampler as sampler_lib

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# name: (model.dtype, model.param_dtype, model.kernel_layout)
_VARIANTS = {
    "in_out": ("float32", "float32", "in_out"),
    "out_in": ("float32", "float32", "out_in"),
    "bf16": ("float32", "bfloat16", "in_out"),
    "bf16_all": ("bfloat16", "bfloat16", "in_out"),
}
# The parity prompts' entry in reference_outputs.json, by config size.
_REFERENCE = {"0.5b": "qwen2_gguf", "1.5b": "qwen2_gguf_1p5b"}


def read_bandwidth() -> float:
  """GB/s numpy reads a 1 GiB float32 array at (best of 3)."""
  a = np.ones(1 << 28, np.float32)
  best = float("inf")
  for _ in range(3):
    t = time.perf_counter()
    a.sum()
    best = min(best, time.perf_counter() - t)
  return a.nbytes / best / 1e9


def step_bytes(params, model_config) -> int:
  """Bytes one decode step reads: all weights but the input embedding and
  any output layer but the designer's (`transformer.head_name`: the
  designer samples)."""
  head = transformer.head_name(model_config, transformer.Role.DESIGNER)
  total = 0
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    names = [str(getattr(k, "key", k)) for k in path]
    if "input_embedding" in names or (names[0] == "heads" and names[1] != head):
      continue
    total += leaf.size * leaf.dtype.itemsize
  return total


def main(argv=None) -> None:
  console.no_tpu_probe()
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--config", default="configs/qwen2p5_coder_0p5b.py")
  p.add_argument("--rows", default="2,8")
  p.add_argument("--tokens", type=int, default=48)
  p.add_argument("--repeats", type=int, default=2)
  p.add_argument("--variants", default="in_out,out_in,bf16,bf16_all")
  args = p.parse_args(argv)
  config = config_lib.load_file(args.config, _ROOT)
  size = config.checkpoint.size
  with open(
      os.path.join(_ROOT, "tests", "model", "reference_outputs.json")
  ) as f:
    reference = json.load(f)["models"][_REFERENCE[size]]["cases"]
  config.model.kernel_layout = "in_out"
  params32 = loading.initial_params(config, jax.random.PRNGKey(0))
  bandwidth = read_bandwidth()
  print(f"read bandwidth {bandwidth:.1f} GB/s (numpy sum of 1 GiB)")
  figures = {"model": f"qwen2.5-coder-{size}", "read_gbs": round(bandwidth, 1)}
  parity_tokens = {}
  variants = args.variants.split(",")
  for name in variants:
    dtype, param_dtype, kernel_layout = _VARIANTS[name]
    m = config.model.copy_and_resolve_references()
    m.dtype, m.param_dtype = dtype, param_dtype
    m.kernel_layout = kernel_layout
    params = jax.tree.map(lambda x: x.astype(param_dtype), params32)
    if kernel_layout == "out_in":
      params = layers.kernels_out_in(params)  # new arrays, transposed
    nbytes = step_bytes(params, m)
    sampler = sampler_lib.Sampler(
        *transformer.sampling_fns(m, transformer.Role.DESIGNER), pad_id=0
    )
    out = sampler(
        params,
        [c["prompt_ids"] for c in reference],
        max_new_tokens=len(reference[0]["hf_greedy_ids"]),
        rng=jax.random.PRNGKey(0),
        temperature=0.0,
    )
    parity_tokens[name] = np.asarray(out.tokens)
    first = parity_tokens[variants[0]]
    same = bool(np.array_equal(parity_tokens[name], first))
    hf = all(
        np.array_equal(out.tokens[i], c["hf_greedy_ids"])
        for i, c in enumerate(reference)
    )
    figures[f"{name}_parity"] = int(same)
    line = [f"{name}: {nbytes / 1e9:.2f} GB a step"]
    for rows in [int(r) for r in args.rows.split(",")]:
      prompt = reference[1]["prompt_ids"]
      batch = [prompt] * rows

      def run(new, batch=batch):
        t = time.perf_counter()
        o = sampler(
            params,
            batch,
            max_new_tokens=new,
            rng=jax.random.PRNGKey(1),
            temperature=0.0,
        )
        jax.block_until_ready(o.tokens)
        return time.perf_counter() - t

      run(1), run(args.tokens)  # compile both
      prefill = min(run(1) for _ in range(args.repeats))
      whole = min(run(args.tokens) for _ in range(args.repeats))
      step = max(whole - prefill, 1e-9) / (args.tokens - 1)
      frac = nbytes / step / 1e9 / bandwidth
      figures[f"{name}_rows{rows}_tok_s"] = round(rows / step, 1)
      figures[f"{name}_rows{rows}_bound_frac"] = round(frac, 3)
      line.append(
          f"rows={rows}: {step * 1e3:.0f} ms a step, {rows / step:.1f} tok/s,"
          f" {frac:.2f} of the bound"
      )
    line.append(
        f"greedy tokens {'equal' if same else 'differ from'} {variants[0]}'s"
        f" (transformers' {'equal' if hf else 'differ'})"
    )
    print("; ".join(line), flush=True)
  print(" ".join(f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
  main()
