r"""Decode speed of Gemma 3 270M: our compiled sampler against transformers.

One run measures, on the same GGUF weights in float32:

* decode tokens/s at batch 1, 8 and 32 (greedy, an 8-token prompt, no stop
  tokens so every row decodes `--new_tokens`; tokens/s = batch * new tokens /
  wall time of the call, compilation excluded by a warm-up call);
* the time to prefill a 512-token prompt (batch 1, one new token).

SPADE side: `spade.sampling.sampler.Sampler` over
`spade.model.transformer.sampling_fns`. Reference: transformers'
`generate` on the model read with `gguf_file=` (`pip install torch==2.13.0
'transformers<5.13' accelerate`). The last line is key=value pairs. Run:

  python benchmarks/sampling.py
  python benchmarks/sampling.py --skip_hf   # our sampler only
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

import jax
import numpy as np

from spade import config as config_lib
from spade.model import checkpoints
from spade.model import gguf_files
from spade.model import transformer
from spade.sampling import sampler as sampler_lib

BATCHES = (1, 8, 32)
PROMPT = [2, 818, 5279, 529, 7001, 563, 496, 1401]  # <bos> + 7 word pieces


def _config():
  c = config_lib.base_config()
  c.model.update(transformer.gemma3_shapes("270m"))
  c.model.max_len = 1024
  c.checkpoint.kind = "gemma3_gguf"
  c.tokenizer.kind = "gemma_sp"
  return c


def _log(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


def _timed(fn, repeats: int = 1) -> float:
  """Best wall time of `repeats` calls after one warm-up (compilation)."""
  fn()
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - start)
  return best


def bench_spade(config, new_tokens: int) -> dict[str, float]:
  """Our sampler: decode tok/s per batch size and 512-token prefill seconds."""
  start = time.perf_counter()
  params = checkpoints.initial_params(config)
  _log(f"spade: loaded in {time.perf_counter() - start:.1f}s")
  sampler = sampler_lib.Sampler(
      *transformer.sampling_fns(config.model, transformer.Role.AGENT), pad_id=0
  )
  rng = jax.random.PRNGKey(0)
  out = {}
  for b in BATCHES:
    prompts = [PROMPT] * b

    def run(prompts=prompts):
      return sampler(
          params, prompts, max_new_tokens=new_tokens, rng=rng, temperature=0.0
      )

    seconds = _timed(run)
    out[f"spade_b{b}_tok_s"] = b * new_tokens / seconds
    _log(f"spade: batch {b}: {out[f'spade_b{b}_tok_s']:.1f} tok/s")
  long_prompt = [PROMPT[0]] + [PROMPT[1 + i % 7] for i in range(511)]
  out["spade_prefill512_s"] = _timed(
      lambda: sampler(
          params, [long_prompt], max_new_tokens=1, rng=rng, temperature=0.0
      )
  )
  _log(f"spade: prefill 512: {out['spade_prefill512_s']:.2f}s")
  return out


def bench_hf(path: str, new_tokens: int, threads: int) -> dict[str, float]:
  """transformers' generate on the same GGUF file, float32."""
  # pylint: disable=g-import-not-at-top
  import torch
  import transformers

  torch.set_num_threads(threads)
  start = time.perf_counter()
  model = transformers.AutoModelForCausalLM.from_pretrained(
      os.path.dirname(path),
      gguf_file=os.path.basename(path),
      dtype=torch.float32,
  )
  model.eval()
  _log(f"hf: loaded in {time.perf_counter() - start:.1f}s")
  out = {}
  for b in BATCHES:
    ids = torch.tensor([PROMPT] * b)

    def run(ids=ids):
      with torch.no_grad():
        model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )

    seconds = _timed(run)
    out[f"hf_b{b}_tok_s"] = b * new_tokens / seconds
    _log(f"hf: batch {b}: {out[f'hf_b{b}_tok_s']:.1f} tok/s")
  long_ids = torch.tensor(
      [[PROMPT[0]] + [PROMPT[1 + i % 7] for i in range(511)]]
  )

  def prefill():
    with torch.no_grad():
      model(long_ids)

  out["hf_prefill512_s"] = _timed(prefill)
  _log(f"hf: prefill 512: {out['hf_prefill512_s']:.2f}s")
  return out


def main() -> None:
  """Runs both sides and prints the key=value summary last."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--new_tokens", type=int, default=32)
  parser.add_argument("--skip_hf", action="store_true")
  parser.add_argument("--torch_threads", type=int, default=os.cpu_count())
  args = parser.parse_args()
  config = _config()
  results = bench_spade(config, args.new_tokens)
  if not args.skip_hf:
    path = gguf_files.gemma3_270m_path()
    results.update(bench_hf(path, args.new_tokens, args.torch_threads))
    for b in BATCHES:
      results[f"ratio_b{b}"] = (
          results[f"spade_b{b}_tok_s"] / results[f"hf_b{b}_tok_s"]
      )
  results["peak_rss_mb"] = (
      resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  )
  results["new_tokens"] = args.new_tokens
  print(" ".join(f"{k}={v:.3g}" for k, v in results.items()))


if __name__ == "__main__":
  np.set_printoptions(precision=3)
  main()
