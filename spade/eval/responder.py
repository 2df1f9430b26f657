"""The model-backed `Responder`: the agent head of the shared transformer.

Prompts are rendered in the checkpoint's chat format (the tokenizer's
`chat_prompt`) and cut to the agent's prompt budget by the rollout engine's
own rule (`spade.agent.prompts.truncate_messages`), so the agent is evaluated
on prompts built the way it is trained on. Sampling uses the compiled
`spade.sampling.sampler.Sampler` with the agent head (`Role.AGENT`).

To keep the number of compilations small, every call is padded to
`config.eval.batch_size` rows and a power-of-two prompt length (at least 64,
at most the prompt budget).
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import ml_collections
import numpy as np

from spade.agent import prompts as prompts_lib
from spade.eval import registry
from spade.eval import runner
from spade.model import tokenizer as tokenizer_lib
from spade.model import transformer
from spade.sampling import sampler as sampler_lib
from spade.sampling import shapes


# Samplers by (model config, ids, mesh): `run_suites` builds a responder at
# every in-loop evaluation, and a new Sampler would compile again.
_SAMPLERS: dict[tuple, sampler_lib.Sampler] = {}


def _agent_sampler(config, tokenizer, mesh) -> sampler_lib.Sampler:
  rules = tuple(tuple(r) for r in config.mesh.rules) if mesh else ()
  key = (
      config.model.to_json(),
      tokenizer.pad_id,
      tuple(tokenizer.stop_ids),
      id(mesh),
      repr(rules),
  )
  if key not in _SAMPLERS:
    _SAMPLERS[key] = sampler_lib.Sampler(
        *transformer.sampling_fns(config.model, transformer.Role.AGENT),
        pad_id=tokenizer.pad_id,
        stop_ids=tuple(tokenizer.stop_ids),
        mesh=mesh,
        rules=rules,
    )
  return _SAMPLERS[key]


class ModelResponder:
  """Answers chat prompts with the agent head of `params`.

  Attributes:
    max_new_tokens: tokens generated per reply (`config.eval.max_new_tokens`,
      0 meaning `config.agent.max_new_tokens`).
    max_prompt_tokens: the prompt budget, `config.agent.max_context` capped so
      that prompt plus reply fit in `config.model.max_len`.
  """

  def __init__(
      self,
      config: ml_collections.ConfigDict,
      params: Any,
      *,
      seed: int = 0,
      mesh: Any = None,
  ):
    """Builds the tokenizer and the agent's sampler.

    Args:
      config: the experiment config (model, tokenizer, agent, eval sections).
      params: the shared parameters (both heads).
      seed: base of the sampling keys (irrelevant when greedy).
      mesh: optional device mesh that `params` are sharded over (with
        `config.mesh.rules`); rows are then split over its batch axes.
    """
    section = runner.eval_config(config)
    self._params = params
    self._tokenizer = tokenizer_lib.build_tokenizer(config)
    self.max_new_tokens = int(section.max_new_tokens)
    self.max_prompt_tokens = min(
        int(config.agent.max_context),
        int(config.model.max_len) - self.max_new_tokens,
    )
    if self.max_prompt_tokens < 1:
      raise registry.EvalError(
          f"config.eval.max_new_tokens={self.max_new_tokens} leaves no room"
          f" for a prompt in config.model.max_len={config.model.max_len}"
      )
    self.batch_size = int(section.batch_size)
    if mesh is not None:
      # Rows are sharded over the mesh's batch axes: round up to a multiple.
      shards = int(mesh.shape["data"]) * int(mesh.shape["fsdp"])
      self.batch_size = -(-self.batch_size // shards) * shards
    self.temperature = float(section.temperature)
    self._top_k = int(config.sampling.top_k)
    self._top_p = float(config.sampling.top_p)
    self._key = jax.random.PRNGKey(seed)
    self._calls = 0
    self._sampler = _agent_sampler(config, self._tokenizer, mesh)

  def render(self, messages: registry.Messages) -> list[int]:
    """Chat messages -> prompt token ids, ending with the assistant opener."""
    return self._tokenizer.encode(
        self._tokenizer.chat_prompt(messages), add_bos=True
    )

  def respond(self, prompts: Sequence[registry.Messages]) -> list[str]:
    """One sampled reply per prompt, `batch_size` prompts per sampler call."""
    replies = []
    for start in range(0, len(prompts), self.batch_size):
      chunk = prompts[start : start + self.batch_size]
      ids = [
          prompts_lib.truncate_messages(m, self.render, self.max_prompt_tokens)
          for m in chunk
      ]
      # Filler rows repeat the last prompt so the batch shape never changes.
      rows = ids + [ids[-1]] * (self.batch_size - len(ids))
      length = shapes.bucket(
          max(len(r) for r in rows), minimum=64, cap=self.max_prompt_tokens
      )
      tokens, lengths = sampler_lib.left_pad(
          rows, length, self._tokenizer.pad_id
      )
      out = self._sampler(
          self._params,
          tokens,
          lengths,
          max_new_tokens=self.max_new_tokens,
          rng=jax.random.fold_in(self._key, self._calls),
          temperature=self.temperature,
          top_k=self._top_k,
          top_p=self._top_p,
      )
      self._calls += 1
      for i in range(len(ids)):
        n = int(out.lengths[i])
        replies.append(self._tokenizer.decode(np.asarray(out.tokens[i, :n])))
    return replies
