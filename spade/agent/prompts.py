"""Agent prompts and the history truncation rule."""

from __future__ import annotations

import json
from typing import Any, Callable

AGENT_SYSTEM = (
    "You are playing a multi-turn environment. Each turn, read the"
    " observation and reply with your next action. Put game moves inside"
    " \\boxed{...}; for tool-use tasks call tools with"
    ' <tool_call>{"name": ..., "arguments": {...}}</tool_call> and submit'
    " <answer>...</answer> when done."
)


def tools_suffix(tools: Any) -> str:
  """The text appended to a tool-use environment's first observation."""
  if not tools:
    return ""
  return "\n\nTools:\n" + json.dumps(tools, indent=1)


def first_message(observation: str, hint: str | None) -> str:
  """The first user turn: the observation, plus the hint when given."""
  if hint:
    return f"{observation}\n\nHint: {hint}"
  return observation


def history_messages(
    first_observation: str,
    hint: str | None,
    turns: list[tuple[str, str]],
) -> list[dict[str, str]]:
  """Chat messages for the next agent turn.

  Args:
    first_observation: what `reset()` returned.
    hint: the privileged hint (hinted episodes) or None.
    turns: (action, observation after it) for every turn played so far.

  Returns:
    System, first user turn, then alternating assistant/user turns.
  """
  messages = [
      {"role": "system", "content": AGENT_SYSTEM},
      {"role": "user", "content": first_message(first_observation, hint)},
  ]
  for action, observation in turns:
    messages.append({"role": "assistant", "content": action})
    messages.append({"role": "user", "content": observation})
  return messages


def truncate_messages(
    messages: list[dict[str, str]],
    render: Callable[[list[dict[str, str]]], list[int]],
    max_tokens: int,
) -> list[int]:
  """Renders messages to at most `max_tokens` prompt tokens.

  The rule: the system message and the first user turn (the task and the
  hint) are kept; whole (assistant, user) turn pairs are dropped oldest first
  until the prompt fits; if it still does not fit, the rendered prompt is cut
  from the left, keeping the most recent tokens (the sampler's own rule).

  Args:
    messages: output of `history_messages`.
    render: renders messages to token ids (the tokenizer's chat format, ending
      with the assistant turn opener).
    max_tokens: the budget.

  Returns:
    Token ids, at most `max_tokens` long.
  """
  head, tail = messages[:2], messages[2:]
  ids = render(head + tail)
  while len(ids) > max_tokens and tail:
    tail = tail[2:]
    ids = render(head + tail)
  return ids[-max_tokens:]
