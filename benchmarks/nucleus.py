r"""The nucleus (top-p without top-k) by bisection against a sort, side by side.

  python benchmarks/nucleus.py [--vocab=151936] [--rows=1,4,16] [--top_p=0.9]

`spade.sampling.sampler.sample_logits` keeps, for top_p < 1 without top_k,
every logit >= the nucleus's smallest kept logit. `_nucleus_threshold` finds
that value by bisection over the floats' order (32 masked sums over the
vocabulary); `nucleus_threshold_sorted` by sorting the vocabulary, the
definition. Both are jitted and timed on the same normal logits (scale 3),
best of `--repeats` after a warm-up call, in one process. Their thresholds
agree up to the order the masses are summed in: where the mass before a
tail token is within float rounding of top_p, one keeps that token and the
other does not. `rows<R>_differ` counts such rows and `rows<R>_mass` is
the largest probability mass kept by one and not the other. The last line:

  vocab=... top_p=... rows<R>_sorted_ms=... rows<R>_bisect_ms=... rows<R>_speedup=... rows<R>_differ=... rows<R>_mass=...
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from spade.sampling import sampler


def best_ms(fn, *args, repeats: int) -> float:
  """The fastest of `repeats` calls, in ms, after one warm-up call."""
  jax.block_until_ready(fn(*args))
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    best = min(best, time.perf_counter() - t)
  return best * 1e3


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--vocab", type=int, default=151936)  # Qwen2.5's
  p.add_argument("--rows", default="1,4,16")
  p.add_argument("--top_p", type=float, default=0.9)  # the hint writer's
  p.add_argument("--repeats", type=int, default=5)
  args = p.parse_args()
  top_p = jnp.float32(args.top_p)
  sort = jax.jit(sampler.nucleus_threshold_sorted)
  bisect = jax.jit(sampler._nucleus_threshold)  # pylint: disable=protected-access
  figures = [f"vocab={args.vocab}", f"top_p={args.top_p}"]
  for rows in (int(r) for r in args.rows.split(",")):
    x = jax.random.normal(jax.random.key(rows), (rows, args.vocab)) * 3
    a, b = np.asarray(bisect(x, top_p)), np.asarray(sort(x, top_p))
    probs = np.asarray(jax.nn.softmax(x, -1))
    logits = np.asarray(x)
    between = (logits >= np.minimum(a, b)) & (logits < np.maximum(a, b))
    mass = float((probs * between).sum(-1).max())
    differ = int((a != b).sum())
    sorted_ms = best_ms(sort, x, top_p, repeats=args.repeats)
    bisect_ms = best_ms(bisect, x, top_p, repeats=args.repeats)
    print(
        f"rows={rows}: sorted {sorted_ms:.1f} ms, bisection"
        f" {bisect_ms:.1f} ms, x{sorted_ms / bisect_ms:.1f}; thresholds"
        f" differ in {differ} of {rows} rows, by at most {mass:.2e} of mass",
        flush=True,
    )
    figures += [
        f"rows{rows}_sorted_ms={sorted_ms:.1f}",
        f"rows{rows}_bisect_ms={bisect_ms:.1f}",
        f"rows{rows}_speedup={sorted_ms / bisect_ms:.1f}",
        f"rows{rows}_differ={differ}",
        f"rows{rows}_mass={mass:.2e}",
    ]
  print(" ".join(figures))


if __name__ == "__main__":
  main()
