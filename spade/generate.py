r"""Samples a continuation of one prompt and prints it (and only it) on stdout.

  python -m spade.generate --config=configs/gemma3_270m.py \
      --prompt="def fibonacci(n):" --max_new_tokens=32 --temperature=0
  python -m spade.generate --config=configs/qwen2p5_coder_0p5b.py --chat \
      --prompt="Reverse a string in Python." --max_new_tokens=64

The weights and tokenizer come from the config (`checkpoint`, `tokenizer`),
the sampler is `spade.sampling.text.TextGenerator`. `--chat` wraps the prompt
as one user turn in the checkpoint's chat format. Logs and progress go to
stderr, so the output can be piped.
"""

from __future__ import annotations

import sys
import time
from typing import NoReturn

from absl import app
from absl import flags
from ml_collections import config_flags

from spade import config as config_lib

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file, e.g. configs/gemma3_270m.py"
)
_PROMPT = flags.DEFINE_string("prompt", None, "The prompt text.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 32, "Tokens to generate.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "0 is greedy.")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Keep the k most likely (0: all).")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Nucleus mass (1.0: all).")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_ROLE = flags.DEFINE_enum(
    "role", "agent", ["agent", "designer"], "Which head samples."
)
_CHAT = flags.DEFINE_bool(
    "chat", False, "Wrap the prompt as a user turn in the chat format."
)


def _fail(message: str) -> NoReturn:
  print(f"spade.generate: error: {message}", file=sys.stderr)
  sys.exit(2)


def _log(message: str) -> None:
  print(f"[spade.generate] {message}", file=sys.stderr, flush=True)


def main(argv: list[str]) -> None:
  """Loads the model of `--config` and prints one continuation."""
  if len(argv) > 1:
    _fail(f"unexpected arguments: {' '.join(argv[1:])}")
  if _CONFIG.value is None:
    _fail("--config is required, e.g. --config=configs/gemma3_270m.py")
  if _PROMPT.value is None:
    _fail("--prompt is required")
  config = config_lib.validated(_CONFIG.value, _fail)
  if _MAX_NEW.value < 1 or _MAX_NEW.value >= config.model.max_len:
    _fail(
        f"--max_new_tokens={_MAX_NEW.value} must be in [1, "
        f"config.model.max_len={config.model.max_len})"
    )

  # Heavy imports after the flag checks, so usage errors are instant.
  # pylint: disable=g-import-not-at-top
  import jax
  from spade.model import loading
  from spade.model import tokenizer as tokenizer_lib
  from spade.model import transformer
  from spade.sampling import text

  start = time.time()
  try:
    tokenizer = tokenizer_lib.build_tokenizer(config)
    params = loading.initial_params(config, jax.random.PRNGKey(config.seed))
  except (loading.CheckpointFileError, FileNotFoundError) as e:
    _fail(str(e))
  _log(f"loaded {config.checkpoint.kind} in {time.time() - start:.1f}s")
  prompt = _PROMPT.value
  if _CHAT.value:
    prompt = tokenizer.chat_prompt([{"role": "user", "content": prompt}])
  generator = text.TextGenerator(config.model, tokenizer)
  start = time.time()
  (completion,) = generator.generate(
      params,
      [prompt],
      role=transformer.Role[_ROLE.value.upper()],
      max_new_tokens=_MAX_NEW.value,
      temperature=_TEMPERATURE.value,
      top_k=_TOP_K.value,
      top_p=_TOP_P.value,
      rng=jax.random.PRNGKey(_SEED.value),
  )
  _log(
      f"{len(completion.token_ids)} tokens in {time.time() - start:.1f}s "
      "(including compilation)"
  )
  sys.stdout.write(completion.text)
  sys.stdout.write("\n")
  sys.stdout.flush()


if __name__ == "__main__":
  app.run(main)
