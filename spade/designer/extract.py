"""Pulls the program out of a designer sample."""

from __future__ import annotations

import json
import re

_JSON_FENCE = re.compile(r"```json\s*\n?(.*?)\n?```", re.DOTALL)
_HINT_LABEL = re.compile(r"^\**hint\**\s*:\s*\**\s*", re.IGNORECASE)
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(sample: str) -> str:
  """Returns the program in a designer sample.

  The rule, in order: the longest fenced block that defines a class (a
  sample may carry a usage example in a second block); else the longest
  fenced block; else, with no fence, the text from the first `import`, `from`
  or `class` line on; else the sample itself (the validator then reports the
  syntax error, so nothing is silently dropped).

  Args:
    sample: the decoded designer completion.

  Returns:
    Python source text.
  """
  blocks = [b.strip("\n") for b in _FENCE.findall(sample)]
  with_class = [b for b in blocks if re.search(r"^class \w+", b, re.M)]
  for pool in (with_class, blocks):
    if pool:
      return max(pool, key=len) + "\n"
  match = re.search(r"^(import |from |class )", sample, re.M)
  if match:
    return sample[match.start() :].rstrip() + "\n"
  return sample


def clean_hint(sample: str, limit: int = 600) -> str:
  """Normalises a model-written hint.

  The reference's parse (`hint_generator._parse_hint`): a hint wrapped in a
  ```json block as {"hint": ...} despite the instructions is unwrapped; then,
  ours, a leading "Hint:" label and fences are dropped and only the first
  paragraph is kept, bounded in length (the prompt asks for 1-3 sentences;
  a longer reply is usually the hint followed by commentary).

  Args:
    sample: the decoded hint completion.
    limit: the longest hint kept, in characters.

  Returns:
    The hint text (possibly empty).
  """
  text = sample.strip()
  match = _JSON_FENCE.search(text)
  if match:
    try:
      data = json.loads(match.group(1).strip())
    except json.JSONDecodeError:
      data = None
    if isinstance(data, dict) and isinstance(data.get("hint"), str):
      text = data["hint"].strip()
  text = text.strip("`").strip()
  text = _HINT_LABEL.sub("", text).strip()
  text = text.split("\n\n")[0].strip()
  return text[:limit]
