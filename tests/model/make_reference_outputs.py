r"""Writes tests/model/reference_outputs.json: transformers' greedy tokens.

For each GGUF checkpoint, Hugging Face transformers (reading the same GGUF
file with `gguf_file=`, dequantized to float32) greedily continues a few
prompts; `test_hf_parity.py` checks that our model produces the same tokens.
The prompts are tokenized with OUR tokenizer and fed to both models as ids, so
the check is about the weights and the forward pass; the tokenizers are
compared separately in `test_tokenizer.py`. Needs torch and transformers
(`pip install torch==2.13.0 'transformers<5.13'`). Run:

  python tests/model/make_reference_outputs.py                  # all
  python tests/model/make_reference_outputs.py qwen2_gguf_1p5b  # one
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import transformers

from spade.model import gguf_files
from spade.model import tokenizer as tokenizer_lib

HERE = os.path.dirname(os.path.abspath(__file__))
OUTPUT = os.path.join(HERE, "reference_outputs.json")
NEW_TOKENS = 16

PROMPTS = {
    "gemma3_gguf": [
        ("raw", "The capital of France is"),
        ("raw", "def fibonacci(n):\n    "),
    ],
    "qwen2_gguf": [
        ("chat", "Write a Python function that adds two numbers."),
        ("raw", "# Sort a list in place\ndef sort_list(xs):\n"),
    ],
}
PROMPTS["qwen2_gguf_1p5b"] = PROMPTS["qwen2_gguf"]
FILES = {
    "gemma3_gguf": (gguf_files.gemma3_270m_path, "gemma_sp"),
    "qwen2_gguf": (gguf_files.qwen2p5_coder_0p5b_path, "qwen_bpe"),
    "qwen2_gguf_1p5b": (
        lambda: gguf_files.qwen2p5_coder_path("1.5b"),
        "qwen_bpe",
    ),
}


def hf_greedy(model, ids: list[int], new_tokens: int) -> list[int]:
  """transformers' greedy continuation of `ids` (new tokens only)."""
  with torch.no_grad():
    out = model.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,  # compare a fixed number of tokens
        do_sample=False,
        pad_token_id=0,
    )
  return out[0, len(ids) :].tolist()


def main(argv: list[str]) -> None:
  """Writes the reference JSON for the checkpoints named in `argv` (all
  when none), keeping the file's other entries."""
  torch.set_num_threads(2)
  unknown = set(argv) - set(FILES)
  if unknown:
    raise SystemExit(f"unknown checkpoints {sorted(unknown)}; {list(FILES)}")
  result = {"new_tokens": NEW_TOKENS, "models": {}}
  if argv and os.path.exists(OUTPUT):
    with open(OUTPUT) as f:
      result = json.load(f)
  for kind, (find, tok_kind) in FILES.items():
    if argv and kind not in argv:
      continue
    path = find()
    tokenizer = tokenizer_lib.from_gguf(path, tok_kind)
    start = time.time()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path),
        gguf_file=os.path.basename(path),
        dtype=torch.float32,
    )
    model.eval()
    print(f"{kind}: loaded in {time.time() - start:.0f}s", file=sys.stderr)
    cases = []
    for style, text in PROMPTS[kind]:
      if style == "chat":
        text = tokenizer.chat_prompt([{"role": "user", "content": text}])
      ids = tokenizer.encode(text, add_bos=True)
      out = hf_greedy(model, ids, NEW_TOKENS)
      print(f"  {text!r} -> {tokenizer.decode(out)!r}", file=sys.stderr)
      cases.append({"prompt": text, "prompt_ids": ids, "hf_greedy_ids": out})
    result["models"][kind] = {
        "file": os.path.basename(path),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "cases": cases,
    }
    del model
  with open(OUTPUT, "w") as f:
    json.dump(result, f, indent=1)
    f.write("\n")
  print(f"wrote {OUTPUT}", file=sys.stderr)


if __name__ == "__main__":
  main(sys.argv[1:])
