"""Tool calls in an agent's reply, parsed as the reference implementation does.

A reply may hold several ``<tool_call>...</tool_call>`` blocks. Each block is
either JSON (Qwen2.5 style, ``{"name": "lookup", "arguments": {"id": 7}}``)
or XML (Qwen3.5 / qwen3_coder style, ``<function=lookup><parameter=id>7
</parameter></function>``). This is the reference's
``spade/core/utils/tool_call_parser.py`` as a pure function: the rollout
engine executes each call through the environment's ``execute_tool`` (no turn
spent) and sends a reply with an ``<answer>`` or without any parsable call to
``step()``; validation replays solutions by the same rules
(`reply_actions`). Standard library only: the sandbox worker imports it.
"""

from __future__ import annotations

import html
import json
import re
from typing import Any

_BLOCK_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_FUNCTION_RE = re.compile(r"<function=(\w+)>(.*?)</function>", re.DOTALL)
_PARAMETER_RE = re.compile(r"<parameter=(\w+)>(.*?)</parameter>", re.DOTALL)
_JSON_CALL_RE = re.compile(
    r'\{\s*"name"\s*:\s*"(\w+)"\s*,\s*"arguments"\s*:\s*(\{.*?\})\s*\}',
    re.DOTALL,
)
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# Qwen's end-of-turn marker, which the reference strips before parsing.
_END_OF_TURN = "<|im_end|>"


def _parse_xml(block: str) -> dict[str, Any] | None:
  match = _FUNCTION_RE.search(block)
  if match is None:
    return None
  arguments = {}
  for param in _PARAMETER_RE.finditer(match.group(2)):
    value = html.unescape(param.group(2).strip())
    try:
      # Numbers and booleans arrive as text; JSON gives them their type.
      value = json.loads(value)
    except ValueError:
      pass
    arguments[param.group(1)] = value
  return {"name": match.group(1), "arguments": arguments}


def _parse_json(block: str) -> dict[str, Any] | None:
  match = _JSON_CALL_RE.search(block)
  if match is not None:
    try:
      arguments = json.loads(match.group(2))
    except ValueError:
      arguments = {}
    return {"name": match.group(1), "arguments": arguments}
  try:
    data = json.loads(block.strip())
  except ValueError:
    return None
  if not isinstance(data, dict) or "name" not in data:
    return None
  arguments = data.get("arguments", data.get("parameters", {}))
  if isinstance(arguments, str):
    try:
      arguments = json.loads(arguments)
    except ValueError:
      arguments = {}
  return {"name": data["name"], "arguments": arguments}


def parse_tool_calls(text: str) -> list[dict[str, Any]]:
  """Returns the tool calls of a reply, in order, as the reference parses them.

  Args:
    text: the agent's whole reply.

  Returns:
    One {"name": str, "arguments": dict} per ``<tool_call>`` block that parses
    (XML form first, then JSON); blocks that do not parse are skipped, as the
    reference skips them. Arguments are kept as written: when they are not a
    dict, ``execute_tool`` answers with its error output, as upstream.
  """
  if text.endswith(_END_OF_TURN):
    text = text[: -len(_END_OF_TURN)]
  calls = []
  for match in _BLOCK_RE.finditer(text.strip()):
    call = _parse_xml(match.group(1)) or _parse_json(match.group(1))
    if call is not None:
      calls.append(call)
  return calls


def parse_answer(text: str) -> str | None:
  """The stripped content of the first ``<answer>...</answer>``, else None."""
  match = _ANSWER_RE.search(text)
  return None if match is None else match.group(1).strip()


def reply_actions(text: str, has_tools: bool) -> list[tuple[str, Any]]:
  """What the reference does with one reply: the environment calls it makes.

  Args:
    text: the agent's whole reply.
    has_tools: whether the environment's ``get_tools()`` is non-empty; a game
      without tools receives every reply through ``step()``.

  Returns:
    [("step", text)] for a reply that holds an ``<answer>`` or no parsable
    tool call (or any reply to a game without tools); otherwise one
    ("tool", {"name", "arguments"}) per call, each run with ``execute_tool``
    without spending one of the environment's turns.
  """
  if not has_tools or parse_answer(text) is not None:
    return [("step", text)]
  calls = parse_tool_calls(text)
  if not calls:
    return [("step", text)]
  return [("tool", call) for call in calls]
