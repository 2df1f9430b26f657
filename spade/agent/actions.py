r"""What an environment's `step()` receives from an agent reply.

The reference (`spade/core/utils/parsing.py`, `parse_action`, called by
`orchestrator._play_game_async` before every `env.step`) passes a game the
reply's boxed answer re-wrapped as `\boxed{answer}`, and any reply without a
box, or any tool-use reply, stripped of surrounding whitespace. The rules
below are its lines, in JAX-free Python: the first `\boxed{...}` whose
content has no braces (also `\boxed{{x}}` and `\boxed{{{x}}}`); failing
that, the last `\boxed` with its braces balanced, one or two outer brace
pairs peeled off.
"""

from __future__ import annotations

import re

# `config.agent.action` values.
RULES = ("parse", "raw")

_SIMPLE_BOXES = (
    re.compile(r"\\boxed\{([^{}]+)\}"),
    re.compile(r"\\boxed\{\{([^{}]+)\}\}"),
    re.compile(r"\\boxed\{\{\{([^{}]+)\}\}\}"),
)


def extract_boxed_answer(text: str) -> str | None:
  r"""The content of a reply's `\boxed{...}`, or None (parsing.py's rule)."""
  if not text:
    return None
  for pattern in _SIMPLE_BOXES:
    match = pattern.search(text)
    if match:
      return match.group(1).strip()
  boxed = text.rfind("\\boxed")
  start = text.find("{", boxed) if boxed >= 0 else -1
  if start < 0:
    return None
  depth = 0
  for index in range(start, len(text)):
    if text[index] == "{":
      depth += 1
    elif text[index] == "}":
      depth -= 1
      if depth == 0:
        content = text[start + 1 : index].strip()
        for _ in range(2):
          if content.startswith("{") and content.endswith("}"):
            content = content[1:-1].strip()
        return content
  return None


def parse_action(reply: str, tools: bool = False) -> str:
  r"""The reference's `parse_action`: `\boxed{answer}` for a game reply with
  a box, the stripped reply otherwise (and always for tool use)."""
  if tools:
    return reply.strip()
  answer = extract_boxed_answer(reply)
  return f"\\boxed{{{answer}}}" if answer else reply.strip()


def step_action(reply: str, tools: bool = False, rule: str = "parse") -> str:
  """What `step()` receives under `config.agent.action`.

  Args:
    reply: the agent's decoded reply.
    tools: the environment is a tool-use one (`get_tools()` answered).
    rule: "parse" (the reference's `parse_action`) or "raw" (ours:
      the reply as sampled).

  Returns:
    The action string.
  """
  if rule == "parse":
    return parse_action(reply, tools)
  if rule == "raw":
    return reply
  raise ValueError(
      f"unknown action rule {rule!r}; set config.agent.action to one of"
      f" {RULES}"
  )
