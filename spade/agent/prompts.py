"""Agent prompts and the history truncation rule.

Two prompt styles (`agent.prompt_style`):

  "reference"  the reference's actor template (`orchestrator.py`,
               `_apply_game_template("qwen3_game")`): no system message, the
               first user turn is GAME_PREFIX + observation + GAME_SUFFIX,
               the hint injected as "{observation}\n\nHINT: {hint}"
               (`hint_injection_template`); a tool-use environment's
               observation goes unwrapped (the reference passes its tools
               through the chat template; we append them as text and say how
               to call them in a system message, as Qwen's template does).
  "system"     ours: one system message
               (AGENT_SYSTEM) covering games and tools, the observation as
               the first user turn, "\n\nHint: {hint}" after it.

Later observations are plain user turns (tool results `tool` turns) in both.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Sequence

PROMPT_STYLES = ("reference", "system")

GAME_PREFIX = (
    "You are playing a language game. Make valid actions to win.\nObservation: "
)
GAME_SUFFIX = (
    "\nPlease reason step by step, and put your final answer within"
    " \\boxed{}."
)
REFERENCE_HINT = "\n\nHINT: "

# What Qwen's chat template tells a model given tools (the reference's
# tool-use path renders the tools with it).
TOOLS_SYSTEM = (
    "You may call one or more functions to assist with the user query. The"
    " functions are listed after the task. For each function call, return a"
    " json object with function name and arguments within"
    " <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>\nWhen done, give your final answer as <answer>...</answer>."
)

AGENT_SYSTEM = (
    "You are playing a multi-turn environment. Each turn, read the"
    " observation and reply with your next action. Put game moves inside"
    " \\boxed{...}; for tool-use tasks call tools with"
    ' <tool_call>{"name": ..., "arguments": {...}}</tool_call> and submit'
    " <answer>...</answer> when done."
)
SYSTEM_HINT = "\n\nHint: "


def _check_style(style: str) -> None:
  if style not in PROMPT_STYLES:
    raise ValueError(
        f"unknown agent.prompt_style {style!r}; use 'reference' (the"
        " reference's actor template) or 'system'"
    )


def tools_suffix(tools: Any) -> str:
  """The text appended to a tool-use environment's first observation."""
  if not tools:
    return ""
  return "\n\nTools:\n" + json.dumps(tools, indent=1)


def first_message(
    observation: str,
    hint: str | None,
    style: str = "reference",
    tools: bool = False,
) -> str:
  """The first user turn: the observation, plus the hint when given."""
  _check_style(style)
  if style == "system":
    return f"{observation}{SYSTEM_HINT}{hint}" if hint else observation
  shown = f"{observation}{REFERENCE_HINT}{hint}" if hint else observation
  return shown if tools else f"{GAME_PREFIX}{shown}{GAME_SUFFIX}"


def _head(
    first_observation: str, hint: str | None, style: str, tools: bool
) -> list[dict[str, str]]:
  """The system message (when the style has one) and the first user turn."""
  user = {
      "role": "user",
      "content": first_message(first_observation, hint, style, tools),
  }
  if style == "system":
    return [{"role": "system", "content": AGENT_SYSTEM}, user]
  if tools:
    return [{"role": "system", "content": TOOLS_SYSTEM}, user]
  return [user]


def history_messages(
    first_observation: str,
    hint: str | None,
    turns: list[tuple[str, str]],
    *,
    style: str = "reference",
    tools: bool = False,
) -> list[dict[str, str]]:
  """Chat messages for the next agent turn.

  Args:
    first_observation: what `reset()` returned.
    hint: the privileged hint (hinted episodes) or None.
    turns: (action, observation after it) for every turn played so far.
    style: `agent.prompt_style` (module docstring).
    tools: the environment has tools.

  Returns:
    The head (`_head`), then alternating assistant/user turns.
  """
  messages = _head(first_observation, hint, style, tools)
  for action, observation in turns:
    messages.append({"role": "assistant", "content": action})
    messages.append({"role": "user", "content": observation})
  return messages


def episode_messages(
    first_observation: str,
    hint: str | None,
    turns: Sequence[Any],
    *,
    style: str = "reference",
    tools: bool = False,
) -> list[dict[str, str]]:
  """Chat messages for the next agent turn of an episode.

  Args:
    first_observation: what `reset()` returned.
    hint: the privileged hint (hinted episodes) or None.
    turns: the turns played so far (`spade.agent.episodes.Turn`): each is
      the assistant's reply, then one `tool` message per tool result (a
      reply that called tools, as the reference sends them), then the
      environment's observation as a user message when `step()` answered.
    style: `agent.prompt_style` (module docstring).
    tools: the environment has tools.

  Returns:
    The head (`_head`), then the exchanges in order.
  """
  messages = _head(first_observation, hint, style, tools)
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
  chat format, the reference style's wrapper and the hint survive.

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
  prefix, task, hint, suffix = _split_first(first["content"])

  def user(task):
    return [{"role": "user", "content": prefix + task + hint + suffix}]

  while len(ids) > max_tokens and task:
    task = task[: len(task) // 2]
    ids = render(system + user(task))
  # A system message longer than the budget (an evaluation's tool list on a
  # byte-level model): its end goes, its beginning stays.
  while len(ids) > max_tokens and system and system[0]["content"]:
    text = system[0]["content"]
    system = [dict(system[0], content=text[: len(text) // 2])]
    ids = render(system + user(task))
  if len(ids) > max_tokens:
    raise ValueError(
        f"the chat format and hint alone take {len(ids)} tokens, over the"
        f" prompt budget of {max_tokens}; raise model.max_len or lower"
        " agent.max_new_tokens"
    )
  return ids


def _split_first(content: str) -> tuple[str, str, str, str]:
  """(wrapper prefix, task, hint part, wrapper suffix) of a first user turn."""
  prefix = GAME_PREFIX if content.startswith(GAME_PREFIX) else ""
  suffix = GAME_SUFFIX if prefix and content.endswith(GAME_SUFFIX) else ""
  body = content[len(prefix) : len(content) - len(suffix)]
  hint_at = max(body.rfind(REFERENCE_HINT), body.rfind(SYSTEM_HINT))
  if hint_at < 0:
    return prefix, body, "", suffix
  return prefix, body[:hint_at], body[hint_at:], suffix


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
