"""Pulls the program out of a designer sample."""

from __future__ import annotations

import re

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
  """Normalises a model-written hint: first paragraph, bounded length."""
  text = sample.strip().strip("`").strip()
  text = text.split("\n\n")[0].strip()
  return text[:limit]
