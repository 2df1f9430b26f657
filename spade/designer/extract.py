"""Pulls the program out of a designer sample."""

from __future__ import annotations

import ast
import json
import re

_JSON_FENCE = re.compile(r"```json\s*\n?(.*?)\n?```", re.DOTALL)
_HINT_LABEL = re.compile(r"^\**hint\**\s*:\s*\**\s*", re.IGNORECASE)
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


_REFERENCE_FENCE = re.compile(r"```python\n(.*?)\n```", re.DOTALL)

# `config.designer.code_extraction` values.
RULES = ("reference", "longest_class")


def extract_code(sample: str, rule: str = "reference") -> str:
  """Returns the program in a designer sample.

  "reference" (`spade/core/utils/parsing.py`, `extract_game_code`): the
  first ```` ```python ```` block (fence and newline exactly as there), else
  the whole sample, then `repair_fstring_braces`.

  "longest_class" (ours): the longest fenced block that defines a class (a
  sample may carry a usage example in a second block); else the longest
  fenced block; else, with no fence, the text from the first `import`,
  `from` or `class` line on; else the sample itself. Nothing is repaired.

  Either way a sample without code comes back as text, and the validator
  reports the syntax error, so nothing is silently dropped.

  Args:
    sample: the decoded designer completion.
    rule: one of `RULES` (`config.designer.code_extraction`).

  Returns:
    Python source text.
  """
  if rule == "reference":
    match = _REFERENCE_FENCE.search(sample)
    return repair_fstring_braces(match.group(1) if match else sample)
  if rule != "longest_class":
    raise ValueError(
        f"unknown code extraction rule {rule!r}; set"
        f" config.designer.code_extraction to one of {RULES}"
    )
  blocks = [b.strip("\n") for b in _FENCE.findall(sample)]
  with_class = [b for b in blocks if re.search(r"^class \w+", b, re.M)]
  for pool in (with_class, blocks):
    if pool:
      return max(pool, key=len) + "\n"
  match = re.search(r"^(import |from |class )", sample, re.M)
  if match:
    return sample[match.start() :].rstrip() + "\n"
  return sample


def repair_fstring_braces(code: str, max_iter: int = 20) -> str:
  """The reference's repair of unescaped braces (`parsing.py`).

  While the code does not parse, every `{...}` (no nested braces) on the
  failing line whose inside is not a Python expression is doubled to
  `{{...}}`, as an f-string needs for literal braces; up to `max_iter`
  passes, and the code is returned as it stands once a pass changes nothing
  or it parses.

  Args:
    code: Python source.
    max_iter: the most lines repaired.

  Returns:
    The repaired (or unchanged) source.
  """
  for _ in range(max_iter):
    try:
      ast.parse(code)
      return code
    except SyntaxError as exc:
      if not exc.lineno:
        return code
      lines = code.split("\n")
      index = exc.lineno - 1
      if index >= len(lines):
        return code

      def fix(match: re.Match) -> str:
        inner = match.group(1)
        try:
          ast.parse(inner, mode="eval")
          return match.group(0)
        except SyntaxError:
          return "{{" + inner + "}}"

      repaired = re.sub(r"\{([^{}]*)\}", fix, lines[index])
      if repaired == lines[index]:
        return code
      lines[index] = repaired
      code = "\n".join(lines)
  return code


HINT_PARSES = ("reference", "first_paragraph")


def clean_hint(sample: str, rule: str = "reference", limit: int = 600) -> str:
  """A model-written hint as the agent will read it.

  Both rules first do the reference's parse (`hint_generator._parse_hint`):
  the reply stripped, and a hint wrapped in a ```json block as
  {"hint": ...} despite the instructions unwrapped. "reference" keeps that
  whole text. "first_paragraph" (ours) also drops fences and a leading
  "Hint:" label and keeps only the first paragraph, cut to `limit`
  characters (the prompt asks for 1-3 sentences; a longer reply is usually
  the hint followed by commentary).

  Args:
    sample: the decoded hint completion.
    rule: one of `HINT_PARSES` (`config.designer.hint_parse`).
    limit: the longest hint "first_paragraph" keeps, in characters.

  Returns:
    The hint text (possibly empty).
  """
  if rule not in HINT_PARSES:
    raise ValueError(f"hint parse {rule!r} is not one of {HINT_PARSES}")
  text = sample.strip()
  match = _JSON_FENCE.search(text)
  if match:
    try:
      data = json.loads(match.group(1).strip())
    except json.JSONDecodeError:
      data = None
    if isinstance(data, dict) and isinstance(data.get("hint"), str):
      if rule == "reference":
        return data["hint"]
      text = data["hint"].strip()
  if rule == "reference":
    return text
  text = text.strip("`").strip()
  text = _HINT_LABEL.sub("", text).strip()
  text = text.split("\n\n")[0].strip()
  return text[:limit]
