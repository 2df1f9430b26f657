"""Tokenizers: bytes, Gemma SentencePiece and Qwen byte-level BPE.

All three share one interface, `Tokenizer`: `encode`, `decode`, the ids the
sampler needs (`pad_id`, `bos_id`, `eos_id`, `stop_ids`), `vocab_size`, and
`chat_prompt`, which renders a conversation in the checkpoint's own chat format
and ends with the opener of the assistant's turn.

The two pretrained tokenizers are built from the GGUF file's vocabulary, so
that the weights and the vocabulary can never disagree:

* Gemma: a SentencePiece BPE model proto assembled from `tokenizer.ggml.tokens`
  / `scores` / `token_type`. llama.cpp wrote the user-defined whitespace pieces
  with plain spaces; SentencePiece matches them after escaping spaces to
  U+2581, so they are escaped back. SentencePiece never parses control tokens
  out of text, so `<start_of_turn>` and the other control tokens are split out
  first and mapped to their ids.
* Qwen: GPT-2 byte-level BPE over the merges in `tokenizer.ggml.merges`, after
  NFC normalisation and the Qwen2 pre-tokenizer regex; special tokens
  (`<|im_start|>`, `<|im_end|>`, `<|endoftext|>`, ...) are split out first.
"""

from __future__ import annotations

import functools
import json
import os
import unicodedata
from typing import Iterable, Sequence

import regex

# GGUF token types (llama.cpp's enum, also SentencePiece's piece types).
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6

# The Qwen2 pre-tokenizer (tokenizer.json of Qwen2/Qwen2.5).
_QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN_DEFAULT_SYSTEM = (
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
)


class Tokenizer:
  """Text <-> token ids, plus the chat format of a checkpoint.

  Attributes:
    vocab_size: number of ids (the model's `vocab_size` must be at least it).
    pad_id, bos_id, eos_id: special ids.
    stop_ids: ids that end a generated turn (EOS and end-of-turn markers).
    uses_bos: whether `encode(..., add_bos=True)` prepends `bos_id`; False for
      vocabularies whose models were trained without one (Qwen).
  """

  vocab_size: int
  pad_id: int
  bos_id: int
  eos_id: int
  stop_ids: tuple[int, ...]
  uses_bos: bool = True

  def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
    """Returns the ids of `text`; special-token strings map to their ids.

    Args:
      text: the text.
      add_bos: prepend `bos_id` (only when `uses_bos`).
    """
    ids = self._encode(text)
    if add_bos and self.uses_bos:
      ids = [self.bos_id] + ids
    return ids

  def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
    """Returns the text of `ids`; padding and control tokens are dropped.

    Args:
      ids: token ids (ints or a numpy/jax vector).
      skip_special: drop control tokens (BOS, EOS, turn markers, padding);
        False keeps their text.
    """
    return self._decode([int(i) for i in ids], skip_special)

  def chat_prompt(self, messages: Sequence[dict]) -> str:
    """Renders `messages` (dicts with `role` and `content`) for generation.

    Roles are "system", "user", "assistant" and "tool". The text ends with
    the opener of the assistant's turn; encode it with `add_bos=True`.
    Tool results are rendered as Qwen2.5's chat template renders them: one
    user turn holding a `<tool_response>` block per consecutive tool message.
    """
    merged: list[dict] = []
    for m in messages:
      role = m.get("role")
      if role not in ("system", "user", "assistant", "tool"):
        raise ValueError(
            f"chat message role {role!r} must be 'system', 'user',"
            " 'assistant' or 'tool'"
        )
      if role != "tool":
        merged.append(m)
        continue
      block = f"<tool_response>\n{m['content']}\n</tool_response>"
      if merged and merged[-1].get("tool"):
        merged[-1] = dict(
            merged[-1], content=merged[-1]["content"] + "\n" + block
        )
      else:
        merged.append({"role": "user", "content": block, "tool": True})
    return self._chat_prompt(merged)

  def _encode(self, text: str) -> list[int]:
    raise NotImplementedError

  def _decode(self, ids: list[int], skip_special: bool) -> str:
    raise NotImplementedError

  def _chat_prompt(self, messages: list[dict]) -> str:
    raise NotImplementedError


class ByteTokenizer(Tokenizer):
  """UTF-8 bytes 0..255, then pad 256, bos 257, eos 258 (vocab 259).

  The chat format is plain text: `### <role>` headers, each followed by the
  content and a newline, ending with `### assistant\\n`.
  """

  vocab_size = 259
  pad_id, bos_id, eos_id = 256, 257, 258
  stop_ids = (258,)

  def _encode(self, text: str) -> list[int]:
    return list(text.encode("utf-8"))

  def _decode(self, ids: list[int], skip_special: bool) -> str:
    names = {self.pad_id: "<pad>", self.bos_id: "<bos>", self.eos_id: "<eos>"}
    out, pending = [], bytearray()
    for i in ids:
      if 0 <= i < 256:
        pending.append(i)
        continue
      out.append(pending.decode("utf-8", errors="replace"))
      pending = bytearray()
      if not skip_special:
        out.append(names.get(i, f"<{i}>"))
    out.append(pending.decode("utf-8", errors="replace"))
    return "".join(out)

  def _chat_prompt(self, messages: list[dict]) -> str:
    parts = [f"### {m['role']}\n{m['content']}\n" for m in messages]
    return "".join(parts) + "### assistant\n"


def _special_splitter(specials: Iterable[str]):
  """Returns a regex that splits text around the given literal tokens."""
  alternatives = sorted(set(specials), key=len, reverse=True)
  return regex.compile("(" + "|".join(map(regex.escape, alternatives)) + ")")


class GemmaTokenizer(Tokenizer):
  """Gemma's SentencePiece BPE vocabulary, rebuilt from GGUF metadata."""

  def __init__(self, tokens, scores, types, *, bos_id, eos_id, pad_id, unk_id):
    """Builds the SentencePiece model from the GGUF vocabulary lists."""
    # pylint: disable=g-import-not-at-top
    import sentencepiece
    from sentencepiece import sentencepiece_model_pb2 as model_pb2

    proto = model_pb2.ModelProto()
    proto.trainer_spec.model_type = model_pb2.TrainerSpec.BPE
    proto.trainer_spec.vocab_size = len(tokens)
    proto.trainer_spec.byte_fallback = True
    proto.trainer_spec.unk_id = unk_id
    proto.trainer_spec.bos_id = bos_id
    proto.trainer_spec.eos_id = eos_id
    proto.trainer_spec.pad_id = pad_id
    # Gemma's own model: no normalisation, no dummy prefix, keep whitespace.
    proto.normalizer_spec.name = "identity"
    proto.normalizer_spec.add_dummy_prefix = False
    proto.normalizer_spec.remove_extra_whitespaces = False
    proto.normalizer_spec.escape_whitespaces = True
    for n, (token, score, kind) in enumerate(zip(tokens, scores, types)):
      piece = proto.pieces.add()
      if n == unk_id:
        kind = _UNKNOWN  # llama.cpp marks <unk> as control; SentencePiece not
      if kind == _USER_DEFINED and token.strip(" ") == "" and " " in token:
        token = token.replace(" ", "\u2581")
      piece.piece = token
      piece.score = float(score)
      piece.type = int(kind)
    self._sp = sentencepiece.SentencePieceProcessor(
        model_proto=proto.SerializeToString()
    )
    self.vocab_size = len(tokens)
    self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, pad_id
    self._specials = {
        t: i for i, (t, k) in enumerate(zip(tokens, types)) if k == _CONTROL
    }
    self._special_ids = set(self._specials.values())
    self._split = _special_splitter(self._specials)
    end_of_turn = self._specials.get("<end_of_turn>")
    self.stop_ids = tuple(i for i in (eos_id, end_of_turn) if i is not None)

  def _encode(self, text: str) -> list[int]:
    ids = []
    for i, chunk in enumerate(self._split.split(text)):
      if i % 2:
        ids.append(self._specials[chunk])
      elif chunk:
        ids.extend(self._sp.encode(chunk))
    return ids

  def _decode(self, ids: list[int], skip_special: bool) -> str:
    out, run = [], []
    for i in ids:
      if i in self._special_ids:
        out.append(self._sp.decode(run))
        run = []
        if not skip_special:
          out.append(self._sp.id_to_piece(i))
      else:
        run.append(i)
    out.append(self._sp.decode(run))
    return "".join(out)

  def _chat_prompt(self, messages: list[dict]) -> str:
    # Gemma 3's template: a system message is folded into the first user
    # turn; "assistant" is called "model"; contents are stripped.
    system = ""
    if messages and messages[0]["role"] == "system":
      system = messages[0]["content"].strip() + "\n\n"
      messages = messages[1:]
    parts = []
    for n, m in enumerate(messages):
      role = "model" if m["role"] == "assistant" else m["role"]
      prefix = system if n == 0 else ""
      parts.append(
          f"<start_of_turn>{role}\n{prefix}{m['content'].strip()}"
          "<end_of_turn>\n"
      )
    return "".join(parts) + "<start_of_turn>model\n"


@functools.lru_cache(maxsize=1)
def _byte_to_unicode() -> dict[int, str]:
  """GPT-2's reversible map from bytes to printable unicode characters."""
  visible = (
      list(range(ord("!"), ord("~") + 1))
      + list(range(ord("¡"), ord("¬") + 1))
      + list(range(ord("®"), ord("ÿ") + 1))
  )
  chars = list(visible)
  n = 0
  for b in range(256):
    if b not in visible:
      visible.append(b)
      chars.append(256 + n)
      n += 1
  return dict(zip(visible, map(chr, chars)))


class QwenTokenizer(Tokenizer):
  """Qwen2's byte-level BPE vocabulary, rebuilt from GGUF metadata."""

  uses_bos = False

  def __init__(self, tokens, types, merges, *, eos_id, pad_id, bos_id):
    """Builds the BPE tables from the GGUF vocabulary and merges."""
    self.vocab_size = len(tokens)
    self.eos_id, self.pad_id, self.bos_id = eos_id, pad_id, bos_id
    self._vocab = {t: i for i, t in enumerate(tokens)}
    self._tokens = list(tokens)
    self._ranks = {tuple(m.split(" ", 1)): r for r, m in enumerate(merges)}
    self._specials = {
        t: i
        for i, (t, k) in enumerate(zip(tokens, types))
        if k in (_CONTROL, _USER_DEFINED)
    }
    self._control_ids = {
        i for i, k in enumerate(types) if k in (_CONTROL, _UNUSED)
    }
    self._split = _special_splitter(self._specials)
    self._pattern = regex.compile(_QWEN2_PATTERN)
    self._b2u = _byte_to_unicode()
    self._u2b = {c: b for b, c in self._b2u.items()}
    self.stop_ids = tuple(
        i
        for i in (eos_id, self._specials.get("<|im_end|>"), pad_id)
        if i is not None
    )
    self.stop_ids = tuple(dict.fromkeys(self.stop_ids))
    self._bpe = functools.lru_cache(maxsize=65536)(self._bpe_uncached)

  def _bpe_uncached(self, word: str) -> tuple[int, ...]:
    parts = list(word)
    while len(parts) > 1:
      best, best_rank = None, None
      for j in range(len(parts) - 1):
        rank = self._ranks.get((parts[j], parts[j + 1]))
        if rank is not None and (best_rank is None or rank < best_rank):
          best, best_rank = j, rank
      if best is None:
        break
      merged = parts[best] + parts[best + 1]
      # Merge every occurrence of the best pair, left to right, as GPT-2 does.
      out, j = [], 0
      pair = (parts[best], parts[best + 1])
      while j < len(parts):
        if j < len(parts) - 1 and (parts[j], parts[j + 1]) == pair:
          out.append(merged)
          j += 2
        else:
          out.append(parts[j])
          j += 1
      parts = out
    return tuple(self._vocab[p] for p in parts)

  def _encode(self, text: str) -> list[int]:
    ids = []
    for i, chunk in enumerate(self._split.split(text)):
      if i % 2:
        ids.append(self._specials[chunk])
        continue
      if not chunk:
        continue
      chunk = unicodedata.normalize("NFC", chunk)
      for word in self._pattern.findall(chunk):
        mapped = "".join(self._b2u[b] for b in word.encode("utf-8"))
        ids.extend(self._bpe(mapped))
    return ids

  def _decode(self, ids: list[int], skip_special: bool) -> str:
    out = bytearray()
    for i in ids:
      if not 0 <= i < self.vocab_size:
        continue  # ids past the vocabulary (model padding rows) carry no text
      if i in self._control_ids:
        if not skip_special:
          out.extend(self._tokens[i].encode("utf-8"))
        continue
      token = self._tokens[i]
      if token in self._specials:
        out.extend(token.encode("utf-8"))
      else:
        out.extend(self._u2b[c] for c in token)
    return out.decode("utf-8", errors="replace")

  def _chat_prompt(self, messages: list[dict]) -> str:
    # ChatML as in the GGUF's tokenizer.chat_template (no tools): a default
    # system turn when none is given, then each turn, then the opener.
    parts = []
    if not messages or messages[0]["role"] != "system":
      parts.append(f"<|im_start|>system\n{_QWEN_DEFAULT_SYSTEM}<|im_end|>\n")
    for m in messages:
      parts.append(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n")
    return "".join(parts) + "<|im_start|>assistant\n"


def read_vocabulary(path: str, kind: str) -> dict:
  """Reads the tokenizer lists and ids of a GGUF file into a JSON-able dict.

  Args:
    path: the GGUF file.
    kind: "gemma_sp" (needs a SentencePiece, 'llama', vocabulary) or
      "qwen_bpe" (needs a byte-level BPE, 'gpt2', one).
  """
  from spade.model import gguf_files  # pylint: disable=g-import-not-at-top

  if kind not in ("gemma_sp", "qwen_bpe"):
    raise ValueError(f"tokenizer kind {kind!r} is not built from a GGUF file")
  reader = gguf_files.open_gguf(path)

  def get(key, default=None):
    return gguf_files.field(reader, "tokenizer.ggml." + key, default)

  vocab = {"tokens": get("tokens"), "types": get("token_type")}
  if vocab["tokens"] is None or vocab["types"] is None:
    raise gguf_files.CheckpointFileError(
        f"Checkpoint file {path} carries no tokenizer vocabulary."
    )
  model, expected = get("model"), {"gemma_sp": "llama", "qwen_bpe": "gpt2"}
  if model != expected[kind]:
    raise gguf_files.CheckpointFileError(
        f"Checkpoint file {path} has a {model!r} tokenizer, not "
        f"{expected[kind]!r}; set config.tokenizer.kind to match."
    )
  eos = int(get("eos_token_id"))
  vocab["eos_id"] = eos
  if kind == "gemma_sp":
    vocab["scores"] = [float(x) for x in get("scores")]
    vocab["bos_id"] = int(get("bos_token_id"))
    vocab["pad_id"] = int(get("padding_token_id", 0))
    vocab["unk_id"] = int(get("unknown_token_id", 3))
  else:
    vocab["merges"] = get("merges")
    vocab["pad_id"] = int(get("padding_token_id", eos))
    vocab["bos_id"] = int(get("bos_token_id", eos))
  vocab["types"] = [int(t) for t in vocab["types"]]
  return vocab


def from_vocabulary(vocab: dict, kind: str) -> Tokenizer:
  """Builds a tokenizer from `read_vocabulary`'s dict."""
  if kind == "gemma_sp":
    return GemmaTokenizer(
        vocab["tokens"],
        vocab["scores"],
        vocab["types"],
        bos_id=vocab["bos_id"],
        eos_id=vocab["eos_id"],
        pad_id=vocab["pad_id"],
        unk_id=vocab["unk_id"],
    )
  return QwenTokenizer(
      vocab["tokens"],
      vocab["types"],
      vocab["merges"],
      eos_id=vocab["eos_id"],
      pad_id=vocab["pad_id"],
      bos_id=vocab["bos_id"],
  )


def from_gguf(path: str, kind: str) -> Tokenizer:
  """Builds the tokenizer of `kind` ("gemma_sp" or "qwen_bpe") from a GGUF."""
  return from_vocabulary(read_vocabulary(path, kind), kind)


def _cached_vocabulary(path: str, kind: str) -> dict:
  """`read_vocabulary`, kept as JSON in the cache dir beside other files.

  Parsing a GGUF's 262k-entry string arrays takes gguf's reader 15-25 s on
  this CPU; the JSON loads in a fraction of a second. The cache key has the
  file's name, size and mtime, so a replaced file is read again.
  """
  from spade.model import gguf_files  # pylint: disable=g-import-not-at-top

  stat = os.stat(path)
  name = f"{os.path.basename(path)}-{stat.st_size}-{stat.st_mtime_ns}.{kind}"
  cache = os.path.join(gguf_files.cache_dir(), "tokenizers", name + ".json")
  try:
    with open(cache) as f:
      return json.load(f)
  except (OSError, ValueError):
    pass  # absent or unreadable: rebuild from the GGUF below
  vocab = read_vocabulary(path, kind)
  os.makedirs(os.path.dirname(cache), exist_ok=True)
  partial = f"{cache}.{os.getpid()}.partial"
  with open(partial, "w") as f:
    json.dump(vocab, f)
  os.replace(partial, cache)  # atomic: concurrent runs never see half a file
  return vocab


def build_tokenizer(config) -> Tokenizer:
  """Returns the tokenizer for `config.tokenizer.kind`.

  The GGUF kinds read the vocabulary from the checkpoint file found for
  `config.checkpoint` (see `spade.model.gguf_files.find_checkpoint_file`).
  """
  kind = config.tokenizer.kind
  if kind == "bytes":
    return ByteTokenizer()
  if kind not in ("gemma_sp", "qwen_bpe"):
    raise ValueError(
        f"config.tokenizer.kind={kind!r} is not one of bytes, gemma_sp, "
        "qwen_bpe"
    )
  if config.checkpoint.kind == "scratch" and not config.checkpoint.path:
    raise ValueError(
        f"config.tokenizer.kind={kind!r} reads its vocabulary from a GGUF "
        "file: set config.checkpoint.kind (gemma3_gguf / qwen2_gguf) or "
        "config.checkpoint.path."
    )
  if config.checkpoint.kind == "hf":  # a Hugging Face directory
    from spade.model import hf  # pylint: disable=g-import-not-at-top

    path = config.checkpoint.path
    return from_vocabulary(hf.hf_vocabulary(path, kind), kind)
  from spade.model import gguf_files  # pylint: disable=g-import-not-at-top

  probe = config.copy_and_resolve_references()
  if probe.checkpoint.kind == "scratch":
    probe.checkpoint.kind = (
        "gemma3_gguf" if kind == "gemma_sp" else "qwen2_gguf"
    )
  return _cached_from_gguf(gguf_files.find_checkpoint_file(probe), kind)


@functools.lru_cache(maxsize=4)
def _cached_from_gguf(path: str, kind: str) -> Tokenizer:
  # Building the Gemma model proto takes seconds; callers build it repeatedly.
  if not os.path.isfile(path):
    return from_gguf(path, kind)  # raises the error that names the path
  return from_vocabulary(_cached_vocabulary(path, kind), kind)
