r"""Log-prob drift of bfloat16 against float32, on the tiny and a real model.

  python benchmarks/precision.py                       # tiny + Qwen 0.5B
  python benchmarks/precision.py --models=tiny
  python benchmarks/precision.py --tokens=512

Scores one text (this repository's README, cut to --tokens tokens) with the
update's scoring path (`targets=`, float32 log-softmax) three ways: float32
throughout (the reference), bfloat16 activations over float32 parameters
(`model.dtype=bfloat16`, what the TPU configs run), and bfloat16 activations
and parameters (`model.param_dtype=bfloat16` too). Prints the mean and max
absolute difference of the token log-probs against float32, and how often
the argmax token changes. The real model is Qwen2.5-Coder-0.5B-Instruct from
its GGUF (`configs/qwen2p5_coder_0p5b.py`; ~4 GB of host memory while it
loads). The last line is key=value pairs.
"""

from __future__ import annotations

import importlib.util
import os

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from spade import config as config_lib
from spade import console
from spade.model import gguf_files
from spade.model import gguf_tensors
from spade.model import layout
from spade.model import tokenizer as tokenizer_lib
from spade.model import transformer

_MODELS = flags.DEFINE_list("models", ["tiny", "qwen"], "tiny and/or qwen.")
_TOKENS = flags.DEFINE_integer("tokens", 384, "Tokens of text scored.")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _qwen_config():
  path = os.path.join(ROOT, "configs", "qwen2p5_coder_0p5b.py")
  spec = importlib.util.spec_from_file_location("qwen_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def _load(name: str):
  """(config, float32 params, token ids [1, T]) for `name`."""
  with open(os.path.join(ROOT, "README.md")) as f:
    text = f.read()
  if name == "tiny":
    config = config_lib.base_config()
    config.model.update(num_layers=3, sliding_window=4, global_every=3)
    params = transformer.init_params(config.model, jax.random.PRNGKey(0))
    ids = list(text.encode("utf-8"))
  elif name == "qwen":
    config = _qwen_config()
    path = gguf_files.find_checkpoint_file(config)
    tree = gguf_tensors.gguf_params(path, config.model, config.checkpoint.kind)
    tree = layout.to_model_layout(tree, config.model)
    params = jax.tree.map(jnp.asarray, tree)
    del tree
    ids = tokenizer_lib.build_tokenizer(config).encode(text, add_bos=True)
  else:
    raise ValueError(f"unknown model {name!r}: use tiny or qwen")
  return config, params, jnp.asarray([ids[: _TOKENS.value]], jnp.int32)


def _logprobs(model_config, params, tokens):
  model = transformer.build_model(model_config)
  positions = jnp.arange(tokens.shape[1])[None]

  @jax.jit
  def run(params):
    targets = jnp.roll(tokens, -1, axis=1)
    logp, _ = model.apply(
        {"params": params}, tokens, positions, transformer.Role.AGENT,
        targets=targets, chunk=128,
    )  # fmt: skip
    logits, _ = model.apply(
        {"params": params}, tokens, positions, transformer.Role.AGENT
    )
    return logp[:, :-1], jnp.argmax(logits, -1)[:, :-1]

  return jax.device_get(run(params))


def measure(name: str) -> dict[str, float]:
  """Drift figures of one model."""
  config, params, tokens = _load(name)
  ref, ref_argmax = _logprobs(config.model, params, tokens)
  out = {"tokens": tokens.shape[1] - 1}
  for label, param_dtype in (("bf16", "float32"), ("bf16params", "bfloat16")):
    m = config.model.copy_and_resolve_references()
    m.dtype, m.param_dtype = "bfloat16", param_dtype
    p = params
    if param_dtype == "bfloat16":
      p = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    got, argmax = _logprobs(m, p, tokens)
    diff = np.abs(got - ref)
    out[f"{label}_mean_abs"] = float(diff.mean())
    out[f"{label}_max_abs"] = float(diff.max())
    out[f"{label}_argmax_agree"] = float(np.mean(argmax == ref_argmax))
  out["f32_mean_logprob"] = float(ref.mean())
  return out


def main(argv):
  console.no_tpu_probe()  # before JAX starts a backend: no libtpu page
  del argv
  pairs = []
  for name in _MODELS.value:
    r = measure(name)
    print(
        f"{name}: {r['tokens']} tokens, float32 mean log-prob"
        f" {r['f32_mean_logprob']:.3f}; bfloat16 activations: mean |d|"
        f" {r['bf16_mean_abs']:.4f}, max {r['bf16_max_abs']:.4f}, argmax"
        f" agrees {r['bf16_argmax_agree']:.1%}; bfloat16 params too: mean"
        f" {r['bf16params_mean_abs']:.4f}, max {r['bf16params_max_abs']:.4f},"
        f" argmax {r['bf16params_argmax_agree']:.1%}"
    )
    pairs += [f"{name}_{k}={v:.4g}" for k, v in r.items()]
  print(" ".join(pairs))


if __name__ == "__main__":
  app.run(main)
