"""The one generation front end: the sampler behind a tokenizer, either role.

The training loop (`spade.selfplay.engine.Engine.sample`), the evaluation
responder (`spade.eval.responder.ModelResponder`) and `spade.generate` all
sample through `TextGenerator.sample`, so they share one set of rules:

* Truncation: none here. A prompt longer than the room the reply leaves
  (`config.model.max_len - max_new_tokens`) is an error: callers cut chat
  histories first with the one rule, `spade.agent.prompts.truncate_messages`
  to `prompt_budget`, so the trainer later scores every completion in exactly
  the context it was sampled in.
* Shapes: the batch is padded to a power-of-two size (or a fixed `rows`), a
  multiple of the mesh's batch shards, and prompts are left-padded to a
  length from `spade.sampling.shapes.bucket` (powers of two from
  `min_length`, capped at the room), so a run compiles a handful of shapes.
  Filler rows are dropped from the result.
* Samplers: one compiled `Sampler` per (model config, role, tokenizer ids,
  mesh), shared by every generator in the process, so a responder built at
  each in-loop evaluation does not compile again.

`generate` takes text: `tokenizer.encode(prompt, add_bos=True)` (a tokenizer
without BOS, like Qwen's, ignores `add_bos`); render chat prompts with
`tokenizer.chat_prompt` first.

Each `Completion` carries the sampled ids (a stop token, when hit, is kept in
`token_ids` and `logprobs` but not in `text`), the per-token logprobs under the
model before temperature/top-k/top-p (see `spade.sampling.sampler`), the
prompt ids the model saw, and `finished` (a stop token was emitted).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Protocol, Sequence

import jax
import numpy as np

from spade import console
from spade.model import architecture
from spade.model import transformer
from spade.sampling import sampler as sampler_lib
from spade.sampling import shapes


class TokenizerLike(Protocol):
  """The part of `spade.model.tokenizer.Tokenizer` used here."""

  pad_id: int
  stop_ids: tuple[int, ...]

  def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
    """Text -> ids, with the BOS id in front when `add_bos` (if it uses one)."""
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


def prompt_room(
    prompts: Sequence[Sequence[int]], max_new_tokens: int, max_len: int
) -> int:
  """The prompt tokens a reply of `max_new_tokens` leaves in `max_len`.

  The one prompt-room rule of every sampling front end (`TextGenerator`,
  `spade.selfplay.engine.Engine.sample` through the slot engine): nothing
  is cut here, so the trainer later scores a completion in exactly its
  sampled context.

  Raises:
    ValueError: a prompt is empty or longer than that room.
  """
  room = max_len - max_new_tokens
  longest = max((len(p) for p in prompts), default=0)
  if room < 1 or longest > room:
    raise ValueError(
        f"a {longest}-token prompt leaves no room for {max_new_tokens} new"
        f" tokens in config.model.max_len={max_len}: cut chat prompts with"
        " spade.agent.prompts.truncate_messages to the role's prompt budget"
        " first, or lower max_new_tokens"
    )
  if any(not p for p in prompts):
    raise ValueError("an empty prompt: give at least one token per prompt")
  return room


# Compiled samplers shared by every TextGenerator of the process.
_SAMPLERS: dict[tuple, sampler_lib.Sampler] = {}


@dataclasses.dataclass
class _Kept:
  """One call's final cache and, per key, what its row holds."""

  cache: Any
  rows: dict[Any, tuple[int, tuple[int, ...], np.ndarray]]


class Session:
  """KV caches kept between `TextGenerator.sample` calls (multi-turn play).

  A call given `session` and `keys` (one hashable per prompt, e.g. an
  episode id) keeps its final cache; a later call whose prompt for a key
  starts with what that key's row holds (its prompt and every sampled token
  but the last) prefills only the tokens after it, its keys and values
  carried over (`sampler.Carry`). The caches of the last `max_calls` calls
  are kept (e.g. two alternating groups of episodes).
  """

  def __init__(self, max_calls: int = 2):
    self.max_calls = max_calls
    self._kept: list[_Kept] = []
    # Prompt tokens that were carried over instead of prefilled again.
    self.tokens_carried = 0

  def take(self, keys) -> _Kept | None:
    """The kept call holding most of `keys`, removed from the session."""
    best = max(
        self._kept,
        key=lambda k: sum(key in k.rows for key in keys),
        default=None,
    )
    if best is None or not any(key in best.rows for key in keys):
      return None
    self._kept.remove(best)
    return best

  def keep(self, kept: _Kept) -> None:
    self._kept.append(kept)
    del self._kept[: -self.max_calls]


class TextGenerator:
  """Samples either role from one parameter tree (see the module docstring).

  Attributes:
    model_config: `config.model`.
    tokenizer: a `spade.model.tokenizer.Tokenizer` (or anything with encode,
      decode, pad_id, stop_ids).
    mesh: optional mesh (params then come from `sharding.shard_params`).
    rules: logical axis rules (`config.mesh.rules`).
    prefill_chunk: prompt columns per prefill step (`sampling.prefill_chunk`;
      0: the whole prompt at once).
    report_every: decode steps between a call's progress reports (a live
      line when `sample` is given `progress`); 0 compiles no callback.
  """

  def __init__(
      self,
      model_config,
      tokenizer: TokenizerLike,
      *,
      mesh: Any = None,
      rules: Sequence[Any] = (),
      prefill_chunk: int = 512,
      report_every: int = 16,
  ):
    self.model_config = architecture.ModelConfig.from_config(model_config)
    self.prefill_chunk = int(prefill_chunk)
    self.report_every = int(report_every)
    self.tokenizer = tokenizer
    self.mesh = mesh
    self.rules = tuple(
        (name, tuple(t) if isinstance(t, list) else t) for name, t in rules
    )
    # Running totals over this generator's calls: prompt tokens (padding
    # included) a row-by-row prefill would write, and those the sampler's
    # prefix and identical-prompt sharing did not need to.
    self.prefill_tokens = 0
    self.prefill_tokens_saved = 0
    # History tokens whose cache a call carried over (`Session`).
    self.tokens_carried = 0

  @property
  def batch_shards(self) -> int:
    """Rows must come in multiples of this (the mesh's batch axes)."""
    if self.mesh is None:
      return 1
    return int(self.mesh.shape["data"]) * int(self.mesh.shape["fsdp"])

  def sampler(self, role: transformer.Role) -> sampler_lib.Sampler:
    """The compiled sampler of one role (built once per process)."""
    role = transformer.Role(role)
    pad = int(self.tokenizer.pad_id)
    stops = tuple(int(i) for i in self.tokenizer.stop_ids)
    key = (
        self.model_config,
        role,
        pad,
        stops,
        id(self.mesh),
        self.rules,
        self.prefill_chunk,
        self.report_every,
    )
    if key not in _SAMPLERS:
      _SAMPLERS[key] = sampler_lib.Sampler(
          *transformer.sampling_fns(self.model_config, role),
          pad_id=pad,
          stop_ids=stops,
          mesh=self.mesh,
          rules=self.rules,
          prefill_chunk=self.prefill_chunk,
          report_every=self.report_every,
      )
    return _SAMPLERS[key]

  def sample(
      self,
      params: Any,
      prompts: Sequence[Sequence[int]],
      *,
      role: transformer.Role,
      max_new_tokens: int,
      temperature: float,
      rng: jax.Array,
      top_k: int = 0,
      top_p: float = 1.0,
      rows: int = 0,
      min_length: int = 8,
      session: Session | None = None,
      keys: Sequence[Any] | None = None,
      progress: str | None = None,
  ) -> list[Completion]:
    """One completion per token prompt (see the module docstring).

    Args:
      params: the shared parameters (every head).
      prompts: token ids per prompt, each within the room the reply leaves.
      role: which head samples.
      max_new_tokens: the most tokens a completion holds.
      temperature: 0 for greedy.
      rng: the sampling key.
      top_k: keep the k most likely tokens (0 = all).
      top_p: nucleus mass (1.0 = all).
      rows: pad the batch to this many rows (>= len(prompts)); 0 pads to a
        power of two.
      min_length: the smallest prompt-length bucket.
      session: keep this call's cache in it, and continue the rows of an
        earlier call kept there (`Session`); models with sliding windows
        prefill every prompt whole.
      keys: with `session`, one hashable per prompt naming its row.
      progress: a name for the call ("designer sampling"): its first
        compilation per shape is announced, a live line reports tokens/s,
        rows and an ETA every ~10 s, and a closing line the totals.

    Raises:
      ValueError: a prompt does not leave room for `max_new_tokens`.
    """
    if not prompts:
      return []
    prompts = [[int(t) for t in p] for p in prompts]
    room = prompt_room(prompts, max_new_tokens, self.model_config.max_len)
    longest = max(len(p) for p in prompts)
    n = len(prompts)
    batch = rows if rows >= n else shapes.bucket(n)
    batch = shapes.round_up(max(batch, self.batch_shards), self.batch_shards)
    pad = int(self.tokenizer.pad_id)
    # Filler rows repeat the last prompt: they cost the same padded prefill
    # as a one-token row and keep a prefix the real rows share shareable.
    filler = [prompts[-1]] * (batch - n)
    length = shapes.bucket(longest, minimum=min_length, cap=room)
    sampler = self.sampler(role)
    keep = session is not None and sampler.can_continue
    if keep and (keys is None or len(keys) != n):
      raise ValueError("pass one key per prompt with a session")
    carry, todo = None, prompts + filler
    tokens, lengths = sampler_lib.left_pad(todo, length, pad)
    if keep:
      carry, rest = self._carry(session, keys, todo)
      if carry is not None:
        width = max(len(p) for p in rest)
        width = shapes.bucket(width, minimum=min_length, cap=room)
        # Rows that cannot continue (a truncated history) are prefilled
        # whole in a carrying call, without prefix or row sharing: carry
        # only when that writes fewer columns than a call without it.
        if batch * width < sampler.prefill_columns(tokens, lengths):
          tokens, lengths = sampler_lib.left_pad(rest, width, pad)
          carried = sum(len(p) - len(r) for p, r in zip(prompts, rest))
          session.tokens_carried += carried
          self.tokens_carried += carried
        else:
          carry = None
    ticker = None
    if progress:
      console.first_compile(
          f"the {role.name.lower()} sampler",
          (batch, tokens.shape[1]),
          f"{max_new_tokens} new tokens, once per shape",
      )
      ticker = console.Ticker(progress, total=batch * max_new_tokens)
    with console.ticking(ticker) if ticker else contextlib.nullcontext():
      out = sampler(
          params,
          tokens,
          lengths,
          max_new_tokens=max_new_tokens,
          rng=rng,
          temperature=temperature,
          top_k=top_k,
          top_p=top_p,
          carry=carry,
          keep_cache=keep,
      )
    if ticker is not None:
      ticker.close(int(np.sum(out.lengths[:n])), f", {n} rows")
    self.prefill_tokens += batch * (out.shared_prefix + out.prefill_length)
    self.prefill_tokens_saved += out.prefill_tokens_saved
    if carry is not None:
      # A whole-history prefill would have written `length` columns a row.
      self.prefill_tokens += batch * (length - out.prefill_length)
      self.prefill_tokens_saved += batch * (length - out.prefill_length)
    if keep:
      session.keep(
          _Kept(
              out.cache,
              {
                  key: (
                      i,
                      tuple(prompts[i])
                      + tuple(out.tokens[i, : max(int(out.lengths[i]) - 1, 0)]),
                      out.slots[i],
                  )
                  for i, key in enumerate(keys)
              },
          )
      )
    stops = set(int(i) for i in self.tokenizer.stop_ids)
    completions = []
    for i in range(n):
      size = int(out.lengths[i])
      ids = out.tokens[i, :size].tolist()
      finished = bool(out.finished[i])
      text_ids = ids[:-1] if finished and ids and ids[-1] in stops else ids
      completions.append(
          Completion(
              text=self.tokenizer.decode(text_ids),
              token_ids=ids,
              logprobs=out.logprobs[i, :size].astype(float).tolist(),
              prompt_ids=prompts[i],
              finished=finished,
          )
      )
    return completions

  @staticmethod
  def _carry(session: Session, keys, prompts):
    """(the `Carry` of the rows that continue a kept call, or None; each
    row's prompt after its carried tokens)."""
    kept = session.take(keys)
    if kept is None:
      return None, prompts
    rows, slots, todo = [], [], []
    for i, prompt in enumerate(prompts):
      key = keys[min(i, len(keys) - 1)]  # filler rows repeat the last row
      row, held, where = kept.rows.get(key, (-1, (), None))
      if (
          row >= 0
          and len(prompt) > len(held)
          and tuple(prompt[: len(held)]) == held
      ):
        rows.append(row)
        slots.append(where)
        todo.append(prompt[len(held) :])
      else:
        rows.append(-1)
        slots.append(np.zeros((0,), np.int32))
        todo.append(prompt)
    if all(r < 0 for r in rows):
      return None, prompts
    width = shapes.bucket(max(len(w) for w in slots))
    table = np.full((len(rows), width), -1, np.int32)
    for r, where in enumerate(slots):
      table[r, : len(where)] = where
    carry = sampler_lib.Carry(kept.cache, np.asarray(rows, np.int32), table)
    return carry, todo

  def generate(
      self,
      params: Any,
      prompts: Sequence[str],
      **kwargs,
  ) -> list[Completion]:
    """`sample` on text prompts, each encoded with BOS (see `sample`)."""
    ids = [self.tokenizer.encode(p, add_bos=True) for p in prompts]
    return self.sample(params, ids, **kwargs)
