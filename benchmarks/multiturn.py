r"""Multi-turn sampling with and without carrying each episode's KV cache.

  python benchmarks/multiturn.py [--rows=8] [--turns=6] [--prompt=512]

Plays `--rows` episodes for `--turns` turns through
`spade.sampling.text.TextGenerator.sample` on Qwen2.5-Coder-0.5B's shapes
(scratch weights: the time does not depend on them), float32, greedy: each
episode's first prompt is `--prompt` tokens (a 256-token head common to all,
like a system prompt, then its own task), each turn samples `--reply` tokens
(no stop) and appends a `--observation`-token answer. Once every prompt is
prefilled whole each turn (prefix and identical-row sharing on, as in the
loop), once with a `text.Session` carrying each episode's cache. Both runs
compile every shape first (a warm-up pass), so the figures are steady
state. The last line is key=value: seconds per run, the prompt columns each
prefilled (padding included), the history tokens carried and whether both
runs sampled the same tokens.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top
import numpy as np

from spade import config as config_lib
from spade import console
from spade.model import architecture
from spade.model import transformer
from spade.sampling import text


class _Ids:
  """The part of a tokenizer the generator needs (no stop ids)."""

  pad_id = 0
  stop_ids = ()

  def decode(self, ids):
    return ""


def play(gen, params, args, session) -> tuple[float, list[list[int]], int]:
  """Seconds, every turn's sampled ids, prompt columns prefilled."""
  rng = np.random.default_rng(0)
  head = rng.integers(1, 1000, args.prompt // 2).tolist()
  prompts = {
      k: head + rng.integers(1, 1000, args.prompt - len(head)).tolist()
      for k in range(args.rows)
  }
  keys = list(range(args.rows))
  sampled, start = [], time.perf_counter()
  cols = gen.prefill_tokens - gen.prefill_tokens_saved
  for turn in range(args.turns):
    out = gen.sample(
        params, [prompts[k] for k in keys], role=transformer.Role.AGENT,
        max_new_tokens=args.reply, temperature=0.0,
        rng=jax.random.PRNGKey(turn), session=session,
        keys=keys if session is not None else None,
    )  # fmt: skip
    for k, c in zip(keys, out):
      sampled.append(c.token_ids)
      prompts[k] = (
          prompts[k]
          + c.token_ids
          + rng.integers(1, 1000, args.observation).tolist()
      )
    print(f"turn {turn + 1}/{args.turns}: {time.perf_counter() - start:.1f}s",
          file=sys.stderr, flush=True)  # fmt: skip
  cols = gen.prefill_tokens - gen.prefill_tokens_saved - cols
  return time.perf_counter() - start, sampled, cols


def main() -> None:
  console.no_tpu_probe()  # before JAX starts a backend: no libtpu page
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", type=int, default=8)
  parser.add_argument("--turns", type=int, default=6)
  parser.add_argument("--prompt", type=int, default=512)
  parser.add_argument("--reply", type=int, default=32)
  parser.add_argument("--observation", type=int, default=64)
  args = parser.parse_args()
  c = config_lib.base_config()
  c.model.update(architecture.qwen2_shapes("0.5b"))
  c.model.tie_embeddings = False
  c.model.max_len = 4096
  params = transformer.init_params(c.model, jax.random.PRNGKey(0))
  figures = {}
  for name, with_session in (("whole", False), ("carried", True)):
    gen = text.TextGenerator(c.model, _Ids())
    # Warm-up: the same shapes compile here, not in the timed pass.
    play(gen, params, args, text.Session() if with_session else None)
    gen = text.TextGenerator(c.model, _Ids())
    seconds, sampled, cols = play(
        gen, params, args, text.Session() if with_session else None
    )
    figures[name] = (seconds, sampled, cols, gen.tokens_carried)
    print(
        f"{name}: {seconds:.1f}s, {cols} prompt columns prefilled,"
        f" {gen.tokens_carried} history tokens carried",
        file=sys.stderr,
        flush=True,
    )
  whole, carried = figures["whole"], figures["carried"]
  print(
      f"rows={args.rows} turns={args.turns} prompt={args.prompt}"
      f" reply={args.reply} observation={args.observation}"
      f" whole_s={whole[0]:.1f} carried_s={carried[0]:.1f}"
      f" speedup={whole[0] / carried[0]:.2f}"
      f" prefill_columns_whole={whole[2]} prefill_columns_carried={carried[2]}"
      f" tokens_carried={carried[3]} same_tokens={whole[1] == carried[1]}"
  )


if __name__ == "__main__":
  main()
