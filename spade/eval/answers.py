r"""Reading answers, code and tool calls out of free-form model replies.

The rules are fixed and documented because they are part of each score:

- `extract_answer`: the last `<answer>...</answer>`; else the last
  `\boxed{...}` (nested braces allowed); else the last non-empty line, with a
  leading "Answer:" / "Final answer:" removed.
- `extract_code`: the fenced block (```python ... ```) that defines the entry
  point, else the first fenced block, else the whole reply.
- `parse_tool_calls`: every `<tool_call>{"name": ..., "arguments": {...}}
  </tool_call>` block whose body is a JSON object with a string `name`; the
  arguments may also be given as a JSON string or under `parameters`.
"""

from __future__ import annotations

import json
import re

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_FINAL_PREFIX = re.compile(
    r"^(?:final answer|answer)\s*(?:is)?\s*[:=]?\s*", re.IGNORECASE
)
_FENCE = re.compile(
    r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL
)
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def last_boxed(text: str) -> str | None:
  r"""The content of the last `\boxed{...}` in `text`, braces balanced."""
  start = text.rfind("\\boxed{")
  while start != -1:
    depth, i = 0, start + len("\\boxed")
    for i in range(start + len("\\boxed"), len(text)):
      if text[i] == "{":
        depth += 1
      elif text[i] == "}":
        depth -= 1
        if depth == 0:
          return text[start + len("\\boxed{") : i]
    # Unclosed: try an earlier, complete one.
    start = text.rfind("\\boxed{", 0, start)
  return None


def extract_answer(reply: str) -> str:
  """The final answer in `reply` by the module's rule; "" when it is empty."""
  tags = _ANSWER_TAG.findall(reply)
  if tags:
    return tags[-1].strip()
  boxed = last_boxed(reply)
  if boxed is not None:
    return boxed.strip()
  lines = [line.strip() for line in reply.strip().splitlines() if line.strip()]
  if not lines:
    return ""
  return _FINAL_PREFIX.sub("", lines[-1]).strip()


def extract_code(reply: str, entry_point: str | None = None) -> str:
  """The Python code in `reply` by the module's rule."""
  blocks = [
      body
      for lang, body in _FENCE.findall(reply)
      if lang.lower() in ("", "python", "py", "python3")
  ]
  if not blocks:
    return reply
  if entry_point:
    for body in blocks:
      if re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", body, re.M):
        return body
  return blocks[0]


def parse_tool_calls(reply: str) -> list[tuple[str, dict]]:
  """The (name, arguments) of every well-formed tool call, in order."""
  calls = []
  for body in _TOOL_CALL.findall(reply):
    try:
      data = json.loads(body.strip())
    except json.JSONDecodeError:
      continue
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
      continue
    args = data.get("arguments", data.get("parameters", {}))
    if isinstance(args, str):
      try:
        args = json.loads(args)
      except json.JSONDecodeError:
        continue
    if not isinstance(args, dict):
      continue
    calls.append((data["name"], args))
  return calls
