"""Agent prompts and the history truncation rule."""

from __future__ import annotations

import json
from typing import Any, Callable, Sequence

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


def episode_messages(
    first_observation: str,
    hint: str | None,
    turns: Sequence[Any],
) -> list[dict[str, str]]:
  """Chat messages for the next agent turn of an episode.

  Args:
    first_observation: what `reset()` returned.
    hint: the privileged hint (hinted episodes) or None.
    turns: the turns played so far (`spade.agent.episodes.Turn`): each is
      the assistant's reply, then one `tool` message per tool result (a
      reply that called tools, as the reference sends them), then the
      environment's observation as a user message when `step()` answered.

  Returns:
    System, first user turn, then the exchanges in order.
  """
  messages = [
      {"role": "system", "content": AGENT_SYSTEM},
      {"role": "user", "content": first_message(first_observation, hint)},
  ]
  for turn in turns:
    messages.append({"role": "assistant", "content": turn.action})
    for result in turn.tool_results:
      messages.append({"role": "tool", "content": result})
    if not turn.tool_results:
      messages.append({"role": "user", "content": turn.observation})
  return messages


def truncate_messages(
    messages: list[dict[str, str]],
    render: Callable[[list[dict[str, str]]], list[int]],
    max_tokens: int,
) -> list[int]:
  """Renders messages to at most `max_tokens` prompt tokens: THE rule.

  Every prompt the agent samples from goes through here, with
  `max_tokens = prompt_budget(...)`, and the trainer scores the
  reply in exactly the ids returned, so nothing downstream cuts again.

  The rule: the system message and the first user turn (the task and the
  hint) are kept; whole exchanges (an assistant reply and the tool/user
  messages after it) are dropped oldest first until the prompt fits. If the
  system message and first turn alone do not fit, the first observation's
  text is shortened (its beginning and the hint are kept), then the system
  message's; the rendered prompt is never cut from the left, so BOS, the
  chat format and the hint survive.

  Args:
    messages: output of `episode_messages` / `history_messages`.
    render: renders messages to token ids (the tokenizer's chat format, ending
      with the assistant turn opener).
    max_tokens: the budget.

  Returns:
    Token ids, at most `max_tokens` long.

  Raises:
    ValueError: when even a 1-character task does not fit the budget.
  """
  # The head: the system message when there is one, and the first user turn.
  n = 2 if messages and messages[0]["role"] == "system" else 1
  head, tail = messages[:n], messages[n:]
  ids = render(head + tail)
  while len(ids) > max_tokens and tail:
    tail = tail[1:]
    while tail and tail[0]["role"] != "assistant":
      tail = tail[1:]
    ids = render(head + tail)
  if len(ids) <= max_tokens:
    return ids
  system, first = head[:-1], head[-1]
  content = first["content"]
  hint_at = content.rfind("\n\nHint: ")
  task, hint = (
      (content[:hint_at], content[hint_at:]) if hint_at >= 0 else (content, "")
  )
  while len(ids) > max_tokens and task:
    task = task[: len(task) // 2]
    ids = render(system + [{"role": "user", "content": task + hint}])
  # A system message longer than the budget (an evaluation's tool list on a
  # byte-level model): its end goes, its beginning stays.
  while len(ids) > max_tokens and system and system[0]["content"]:
    text = system[0]["content"]
    system = [dict(system[0], content=text[: len(text) // 2])]
    ids = render(system + [{"role": "user", "content": task + hint}])
  if len(ids) > max_tokens:
    raise ValueError(
        f"the chat format and hint alone take {len(ids)} tokens, over the"
        f" prompt budget of {max_tokens}; raise model.max_len or lower"
        " agent.max_new_tokens"
    )
  return ids


def prompt_budget(max_context: int, max_len: int, max_new_tokens: int) -> int:
  """Prompt tokens a reply may be sampled from: min(context, room left).

  One budget for the rollout, the sampler and the trainer: a prompt of this
  length plus `max_new_tokens` always fits `max_len`.
  """
  budget = min(max_context, max_len - max_new_tokens)
  if budget <= 0:
    raise ValueError(
        f"model.max_len={max_len} leaves no room for a prompt before"
        f" {max_new_tokens} new tokens; raise model.max_len"
    )
  return budget
