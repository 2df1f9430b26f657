"""What the agent played: turns with exactly the tokens sampled, and episodes.

Frozen records made by `spade.agent.rollout` once an episode ends; the
trainer scores `Turn.completion_ids` in exactly `Turn.prompt_ids`, the
context they were sampled in.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Turn:
  """One agent reply: exactly the tokens the sampler saw and produced.

  `prompt_ids` is the whole context the reply was sampled from (after the
  one truncation rule), so the trainer scores `completion_ids` in the same
  context. `tool_results` are the outputs of the reply's tool calls, in
  order, when the reply made any.
  """

  prompt_ids: tuple[int, ...]
  completion_ids: tuple[int, ...]
  logprobs: tuple[float, ...]
  action: str
  reward: float
  observation: str
  tool_results: tuple[str, ...] = ()
  # When the prompt is a prefix of the episode's token sequence
  # (`Episode.tokens`), `prompt_ids` is left empty and this is its length.
  context_len: int = 0
  # False: the reply is kept in the history but carries no loss (a
  # malformed tool call under `agent.mask_malformed_tool_calls`).
  trained: bool = True

  def prompt(self, episode: "Episode") -> tuple[int, ...]:
    """The ids this reply was sampled from."""
    return self.prompt_ids or episode.tokens[: self.context_len]


@dataclasses.dataclass(frozen=True)
class Episode:
  """A played episode.

  Attributes:
    env_index: the environment's position in this iteration's list.
    sample: k, the episode's index within its arm.
    hinted: played with the hint.
    seed: the environment's reset seed.
    hint: the hint text shown (None when unhinted).
    first_observation: what reset() returned (plus tool schemas).
    turns: the agent's replies in order.
    terminated: the environment said the episode ended.
    truncated: the environment truncated it, or the turn limit was hit.
    env_failed: the environment crashed, timed out or misbehaved; such an
      episode is masked out of its group and out of the update.
    error: what failed, when something did.
    failure: the reason code of an environment failure ("call_timeout",
      "sandbox_lost", "crash", ...; "prompt" when the environment's words
      cannot fit the prompt), None when the environment did not fail.
  """

  env_index: int
  sample: int
  hinted: bool
  seed: int
  hint: str | None
  first_observation: str
  turns: tuple[Turn, ...]
  terminated: bool
  truncated: bool
  env_failed: bool = False
  error: str | None = None
  failure: str | None = None
  # The episode as one token sequence, exactly as the sampler saw it: the
  # first prompt, then each reply's sampled tokens and the environment's
  # answer rendered between them, up to the end of the last reply;
  # `token_mask` is True on sampled tokens, `token_logprobs` their
  # sampler log-probs. `exact` says the whole episode is in it (its
  # history was never truncated), so it trains as one row.
  tokens: tuple[int, ...] = ()
  token_mask: tuple[bool, ...] = ()
  token_logprobs: tuple[float, ...] = ()
  prompt_len: int = 0
  exact: bool = False

  @property
  def rewards(self) -> tuple[float, ...]:
    return tuple(t.reward for t in self.turns)

  @property
  def total_reward(self) -> float:
    return float(sum(self.rewards))

  def episode_return(self, rule: str = "final_if_terminated") -> float:
    """The episode's return under `agent.return_rule`.

    "final_if_terminated" (the reference's `episode_reward`): the last
    reward clipped to [-1, 1] if the environment terminated the episode,
    else 0. "clipped_total" (ours): the total reward clipped to [0, 1].
    """
    if rule == "final_if_terminated":
      if not self.turns or not self.terminated:
        return 0.0
      return max(-1.0, min(1.0, float(self.turns[-1].reward)))
    if rule == "clipped_total":
      return min(1.0, max(0.0, self.total_reward))
    raise ValueError(
        f"unknown agent.return_rule {rule!r}; use 'final_if_terminated' (the"
        " reference) or 'clipped_total'"
    )

  @property
  def won(self) -> bool:
    return self.terminated and bool(self.turns) and self.turns[-1].reward >= 1
