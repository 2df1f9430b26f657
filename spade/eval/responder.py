"""The model-backed `Responder`: the agent head of the shared transformer.

Prompts are rendered in the checkpoint's chat format (the tokenizer's
`chat_prompt`) and cut to the agent's prompt budget by the rollout's
own rule (`spade.agent.prompts.truncate_messages`), so the agent is evaluated
on prompts built the way it is trained on. Sampling uses the compiled
sampler through the one front end, `spade.sampling.text.TextGenerator`, with
the agent head (`Role.AGENT`).

To keep the number of compilations small, every call is padded to
`config.eval.batch_size` rows and a power-of-two prompt length (at least 64,
at most the room the reply leaves).
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import ml_collections

from spade.agent import prompts as prompts_lib
from spade.eval import registry
from spade.model import tokenizer as tokenizer_lib
from spade.model import transformer
from spade.sampling import shapes
from spade.sampling import text


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
      params: the shared parameters (every head).
      seed: base of the sampling keys (irrelevant when greedy).
      mesh: optional device mesh that `params` are sharded over (with
        `config.mesh.rules`); rows are then split over its batch axes.
    """
    section = registry.eval_config(config)
    self._params = params
    self._tokenizer = tokenizer_lib.build_tokenizer(config)
    self.max_new_tokens = int(section.max_new_tokens)
    try:
      self.max_prompt_tokens = prompts_lib.prompt_budget(
          int(config.agent.max_context),
          int(config.model.max_len),
          self.max_new_tokens,
      )
    except ValueError as e:
      raise registry.EvalError(
          f"config.eval.max_new_tokens={self.max_new_tokens}: {e}"
      ) from e
    self.temperature = float(section.temperature)
    # The agent role's truncation (`agent.top_k`, `agent.top_p`); at the
    # default eval.temperature=0 the reply is greedy and they do not act.
    self._top_k = int(config.agent.top_k)
    self._top_p = float(config.agent.top_p)
    self._key = jax.random.PRNGKey(seed)
    self._calls = 0
    rules = tuple(tuple(r) for r in config.mesh.rules) if mesh else ()
    self._generator = text.TextGenerator(
        config.model,
        self._tokenizer,
        mesh=mesh,
        rules=rules,
        prefill_chunk=config.sampling.prefill_chunk,
    )
    # Rows are sharded over the mesh's batch axes: a multiple of them.
    self.batch_size = shapes.round_up(
        int(section.batch_size), self._generator.batch_shards
    )

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
      out = self._generator.sample(
          self._params,
          ids,
          role=transformer.Role.AGENT,
          max_new_tokens=self.max_new_tokens,
          temperature=self.temperature,
          rng=jax.random.fold_in(self._key, self._calls),
          top_k=self._top_k,
          top_p=self._top_p,
          rows=self.batch_size,  # one batch shape for every call
          min_length=64,
      )
      self._calls += 1
      replies.extend(o.text for o in out)
    return replies
