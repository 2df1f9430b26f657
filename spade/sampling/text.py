"""Text in, completions out: the sampler behind a tokenizer.

The training loop and the eval suites call `TextGenerator.generate` with
strings. Prompt handling rules:

* Encoding: `tokenizer.encode(prompt, add_bos=True)` (a tokenizer without BOS,
  like Qwen's, ignores `add_bos`). Render chat prompts with
  `tokenizer.chat_prompt` first.
* Truncation: a prompt longer than `max_prompt_tokens` (default
  `config.model.max_len - max_new_tokens`) keeps its LAST tokens, because the
  end of a prompt (the latest turn and the assistant opener) is what the reply
  depends on; when the prompt began with BOS, BOS is kept in front.
* Shapes: prompts are left-padded to a power-of-two length (>= 8) and the batch
  to a power-of-two size (and a multiple of the mesh's batch shards), so a run
  compiles a handful of shapes. Filler rows are dropped from the result.

Each `Completion` carries the sampled ids (a stop token, when hit, is kept in
`token_ids` and `logprobs` but not in `text`), the per-token logprobs under the
model before temperature/top-k/top-p (see `spade.sampling.sampler`), the
prompt ids the model actually saw, and `finished` (a stop token was emitted).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, Sequence

import jax
import numpy as np

from spade.model import transformer
from spade.sampling import sampler as sampler_lib


class TokenizerLike(Protocol):
  """The part of `spade.model.tokenizer.Tokenizer` used here."""

  pad_id: int
  bos_id: int
  stop_ids: tuple[int, ...]

  def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
    """Text -> ids, with `bos_id` in front when `add_bos` (if it uses one)."""
    ...

  def decode(self, ids: Sequence[int]) -> str:
    """Ids -> text, special tokens dropped."""
    ...


@dataclasses.dataclass(frozen=True)
class Completion:
  """One prompt's sampled continuation."""

  text: str
  token_ids: list[int]
  logprobs: list[float]
  prompt_ids: list[int]
  finished: bool


def truncate_left(
    ids: Sequence[int], limit: int, bos_id: int | None
) -> list[int]:
  """Keeps the last `limit` ids; a leading `bos_id` stays in front."""
  ids = list(ids)
  if len(ids) <= limit:
    return ids
  if bos_id is not None and ids and ids[0] == bos_id and limit > 1:
    return [bos_id] + ids[len(ids) - limit + 1 :]
  return ids[len(ids) - limit :]


class TextGenerator:
  """Samples text for either role from one parameter tree.

  Attributes:
    model_config: `config.model`.
    tokenizer: a `spade.model.tokenizer.Tokenizer` (or anything with encode,
      decode, pad_id, bos_id, stop_ids).
    mesh: optional mesh (params then come from `sharding.shard_params`).
    rules: logical axis rules (`config.mesh.rules`).
  """

  def __init__(
      self,
      model_config,
      tokenizer: TokenizerLike,
      *,
      mesh: Any = None,
      rules: Sequence[Any] = (),
  ):
    self.model_config = transformer.ModelConfig.from_config(model_config)
    self.tokenizer = tokenizer
    self.mesh = mesh
    self.rules = tuple(
        (name, tuple(t) if isinstance(t, list) else t) for name, t in rules
    )
    self._samplers: dict[transformer.Role, sampler_lib.Sampler] = {}

  def sampler(self, role: transformer.Role) -> sampler_lib.Sampler:
    """The compiled sampler of one role (built once, then reused)."""
    role = transformer.Role(role)
    if role not in self._samplers:
      self._samplers[role] = sampler_lib.Sampler(
          *transformer.sampling_fns(self.model_config, role),
          pad_id=int(self.tokenizer.pad_id),
          stop_ids=tuple(int(i) for i in self.tokenizer.stop_ids),
          mesh=self.mesh,
          rules=self.rules,
      )
    return self._samplers[role]

  def generate(
      self,
      params: Any,
      prompts: Sequence[str],
      *,
      role: transformer.Role,
      max_new_tokens: int,
      temperature: float,
      rng: jax.Array,
      top_k: int = 0,
      top_p: float = 1.0,
      max_prompt_tokens: int | None = None,
  ) -> list[Completion]:
    """Samples one completion per prompt (see the module docstring)."""
    if not prompts:
      return []
    if max_prompt_tokens is None:
      max_prompt_tokens = self.model_config.max_len - max_new_tokens
    if max_prompt_tokens < 1:
      raise ValueError(
          f"no room for a prompt: max_new_tokens={max_new_tokens} leaves "
          f"{max_prompt_tokens} of config.model.max_len="
          f"{self.model_config.max_len}; lower max_new_tokens"
      )
    bos = getattr(self.tokenizer, "bos_id", None)
    ids = [
        truncate_left(
            self.tokenizer.encode(p, add_bos=True) or [bos],
            max_prompt_tokens,
            bos,
        )
        for p in prompts
    ]
    n = len(ids)
    shards = 1
    if self.mesh is not None:
      shards = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
    rows = sampler_lib.bucket(n, minimum=1)
    rows = -(-rows // shards) * shards
    filler = [[int(self.tokenizer.pad_id)]] * (rows - n)
    out = self.sampler(role)(
        params,
        ids + filler,
        max_new_tokens=max_new_tokens,
        rng=rng,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
    )
    stops = set(int(i) for i in self.tokenizer.stop_ids)
    completions = []
    for i in range(n):
      length = int(out.lengths[i])
      tokens = out.tokens[i, :length].tolist()
      finished = bool(out.finished[i])
      text_ids = tokens[:-1] if finished and tokens[-1] in stops else tokens
      completions.append(
          Completion(
              text=self.tokenizer.decode(text_ids),
              token_ids=tokens,
              logprobs=out.logprobs[i, :length].astype(float).tolist(),
              prompt_ids=ids[i],
              finished=finished,
          )
      )
    return completions
