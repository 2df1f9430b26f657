r"""The int8 KV cache against the model's own cache, on real checkpoints.

  python benchmarks/kv_int8.py                   # Gemma 3 270M + Qwen 0.5B
  python benchmarks/kv_int8.py --text_tokens=64

`config.model.kv_cache_dtype="int8"` stores keys and values as int8 with a
float32 scale per vector (`spade.model.kv_cache.quantize`). For each
checkpoint of the parity test (`tests/model/test_hf_parity.py`: Gemma 3 270M
and Qwen2.5-Coder-0.5B from their GGUF files, float32), this prints:

* on the parity prompts, how many of the 16 greedy tokens equal
  transformers' (`tests/model/reference_outputs.json`) with each cache;
* teacher-forced through the cache (the prompt prefilled, then one token a
  step, as decoding runs), over those 16 tokens and over --text_tokens
  tokens of README.md: how often each cache's argmax is the next token's
  argmax under the default cache, the largest and mean change of the
  next token's log-probability, and at each step where the argmax moved,
  the default cache's margin between the two tokens.

The last line is key=value pairs.
"""

from __future__ import annotations

import json
import os

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from spade import config as config_lib
from spade import console
from spade.model import loading
from spade.model import tokenizer as tokenizer_lib
from spade.model import transformer
from spade.sampling import sampler as sampler_lib

_TEXT = flags.DEFINE_integer(
    "text_tokens", 128, "README.md tokens teacher-forced after 16 prefilled."
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = {
    "gemma3_gguf": "gemma3_270m.py",
    "qwen2_gguf": "qwen2p5_coder_0p5b.py",
}
KV = ("", "int8")


def _config(kind: str):
  return config_lib.load_file(os.path.join("configs", MODELS[kind]), ROOT)


def _forced(model_config, params, ids, prompt_len):
  """Log-softmax [len(ids) - prompt_len, V] of each next token, the prompt
  prefilled in one call and the rest fed one token a step."""
  fns = transformer.sampling_fns(model_config, transformer.Role.AGENT)
  params = fns.prepare_params(params)
  step = jax.jit(fns.tokens_to_logits)
  cache = fns.init_cache(1, len(ids) + 1)
  ids = jnp.asarray([ids], jnp.int32)
  pos = jnp.arange(prompt_len)[None]
  logits, cache = step(
      params, ids[:, :prompt_len], pos, jnp.ones_like(pos, bool), cache,
      jnp.int32(0),
  )  # fmt: skip
  out = [logits[0]]
  one = jnp.ones((1, 1), bool)
  for t in range(prompt_len, ids.shape[1] - 1):
    logits, cache = step(
        params, ids[:, t : t + 1], jnp.full((1, 1), t), one, cache,
        jnp.int32(t),
    )  # fmt: skip
    out.append(logits[0])
  return np.asarray(jax.nn.log_softmax(jnp.stack(out), -1))


def _compare(ref, got, ids, prompt_len):
  """Agreement figures of `got` against `ref` (log-softmax rows)."""
  nxt = np.asarray(ids[prompt_len:])
  rows = np.arange(len(nxt))
  d = np.abs(got[rows, nxt] - ref[rows, nxt])
  a, b = ref.argmax(-1), got.argmax(-1)
  margins = [float(ref[i, a[i]] - ref[i, b[i]]) for i in np.flatnonzero(a != b)]
  return dict(
      argmax_agree=float(np.mean(a == b)),
      max_abs=float(d.max()),
      mean_abs=float(d.mean()),
      moved=len(margins),
      largest_margin_moved=max(margins, default=0.0),
  )


def measure(kind: str, text: str) -> dict[str, float]:
  config = _config(kind)
  params = loading.initial_params(config)
  with open(
      os.path.join(ROOT, "tests", "model", "reference_outputs.json")
  ) as f:
    ref = json.load(f)
  cases = ref["models"][kind]["cases"]
  out = {}
  for kv in KV:
    m = config.model.copy_and_resolve_references()
    m.kv_cache_dtype = kv
    sampler = sampler_lib.Sampler(
        *transformer.sampling_fns(m, transformer.Role.AGENT), pad_id=0
    )
    got = sampler(
        params, [c["prompt_ids"] for c in cases],
        max_new_tokens=ref["new_tokens"], rng=jax.random.PRNGKey(0),
        temperature=0.0,
    )  # fmt: skip
    for i, c in enumerate(cases):
      same = int(np.sum(np.asarray(got.tokens[i]) == c["hf_greedy_ids"]))
      out[f"{kv or 'default'}_case{i}_greedy_equal"] = same
  tok = tokenizer_lib.build_tokenizer(config)
  texts = [(c["prompt_ids"] + c["hf_greedy_ids"], len(c["prompt_ids"]))
           for c in cases]  # fmt: skip
  readme = tok.encode(text, add_bos=True)[: 16 + _TEXT.value + 1]
  texts.append((readme, 16))
  for name, group in (("parity", texts[:-1]), ("readme", texts[-1:])):
    figures = []
    for ids, n in group:
      lp = {}
      for kv in KV:
        m = config.model.copy_and_resolve_references()
        m.kv_cache_dtype = kv
        lp[kv] = _forced(m, params, ids, n)
      figures.append((_compare(lp[""], lp["int8"], ids, n), len(ids) - n))
    steps = sum(s for _, s in figures)
    out[f"{name}_steps"] = steps
    out[f"{name}_argmax_agree"] = (
        sum(f["argmax_agree"] * s for f, s in figures) / steps
    )
    out[f"{name}_max_abs"] = max(f["max_abs"] for f, _ in figures)
    out[f"{name}_mean_abs"] = sum(f["mean_abs"] * s for f, s in figures) / steps
    out[f"{name}_moved"] = sum(f["moved"] for f, _ in figures)
    out[f"{name}_largest_margin_moved"] = max(
        f["largest_margin_moved"] for f, _ in figures
    )
  return out


def main(argv):
  console.no_tpu_probe()  # before JAX starts a backend: no libtpu page
  del argv
  with open(os.path.join(ROOT, "README.md")) as f:
    text = f.read()
  pairs = []
  for kind in MODELS:
    r = measure(kind, text)
    greedy = ", ".join(
        f"{k.replace('_greedy_equal', '')} {v}/16"
        for k, v in r.items()
        if k.endswith("_greedy_equal")
    )
    print(f"{kind}: greedy tokens equal to transformers': {greedy}")
    for name in ("parity", "readme"):
      print(
          f"  teacher-forced, {name} ({r[f'{name}_steps']} steps): argmax"
          f" agrees {r[f'{name}_argmax_agree']:.1%}, next-token log-prob"
          f" |d| mean {r[f'{name}_mean_abs']:.4f} max"
          f" {r[f'{name}_max_abs']:.4f}; argmax moved at"
          f" {r[f'{name}_moved']} steps, the default cache's margin there at"
          f" most {r[f'{name}_largest_margin_moved']:.4f}"
      )
    pairs += [f"{kind}_{k}={v:.4g}" for k, v in r.items()]
  print(" ".join(pairs))


if __name__ == "__main__":
  app.run(main)
