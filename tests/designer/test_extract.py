"""Code extraction from designer samples."""

import pytest

from spade.designer import design_prompts
from spade.designer import extract


def test_longest_class_prefers_block_with_class():
  sample = (
      "Here is the env:\n```python\nimport re\nclass FooEnv:\n  pass\n```\n"
      "Usage:\n```python\nenv = FooEnv()\nenv.reset(seed=1)\nprint(env)\n```"
  )
  assert extract.extract_code(sample, "longest_class") == (
      "import re\nclass FooEnv:\n  pass\n"
  )


def test_longest_class_unterminated_fence_and_bare_code():
  def ours(sample):
    return extract.extract_code(sample, "longest_class")

  assert ours("```python\nclass AEnv:\n  x = 1") == "class AEnv:\n  x = 1\n"
  assert ours("Sure!\nimport math\nclass BEnv: pass\n") == (
      "import math\nclass BEnv: pass\n"
  )
  # No code at all: returned as is so the validator reports why.
  assert ours("no code here") == "no code here"


def test_reference_takes_the_first_python_block():
  sample = (
      "Usage first:\n```python\nenv = FooEnv()\n```\nThen the env:\n"
      "```python\nclass FooEnv:\n  pass\n```"
  )
  # parsing.extract_game_code: the first ```python block, whatever it holds.
  assert extract.extract_code(sample) == "env = FooEnv()"
  # A ```py fence or no fence at all: the whole sample (then repaired).
  assert extract.extract_code("```py\nx = 1\n```") == "```py\nx = 1\n```"
  assert extract.extract_code("no code here") == "no code here"
  # An unterminated block is not a block: the whole sample comes back.
  assert extract.extract_code("```python\nclass AEnv:\n  x = 1") == (
      "```python\nclass AEnv:\n  x = 1"
  )


def test_reference_repairs_fstring_braces():
  code = (
      "class GuessEnv:\n"
      "  def reset(self, seed=None):\n"
      "    return f'Answer as {your guess} in \\\\boxed{}, {seed}', {}\n"
  )
  sample = "Here:\n```python\n" + code + "```\nDone."
  got = extract.extract_code(sample)
  # Every {...} on the failing line whose inside is not an expression is
  # doubled, even the empty dict outside the f-string (the reference's rule
  # works on the line, not the string); {seed} stays. The fence's last
  # newline belongs to the fence.
  assert got == (
      "class GuessEnv:\n"
      "  def reset(self, seed=None):\n"
      "    return f'Answer as {{your guess}} in \\\\boxed{{}}, {seed}', {{}}"
  )
  compile(got, "<env>", "exec")
  # Code that parses is left alone; code the repair cannot fix comes back.
  assert extract.repair_fstring_braces("x = {1: 2}\n") == "x = {1: 2}\n"
  assert extract.repair_fstring_braces("def f(:\n") == "def f(:\n"


def test_unknown_rule_names_the_key():
  with pytest.raises(ValueError, match="designer.code_extraction"):
    extract.extract_code("x", "longest")


def test_clean_hint_keeps_first_paragraph():
  rule = "first_paragraph"
  sample = "  Count the 3s.\n\nExtra words"
  assert extract.clean_hint(sample, rule) == "Count the 3s."
  assert len(extract.clean_hint("x" * 5000, rule)) == 600


def test_clean_hint_reference_keeps_the_whole_reply():
  # hint_generator._parse_hint: stripped, JSON unwrapped, nothing cut.
  sample = "  **Hint:** Count the 3s.\n\nThen add them.  "
  assert (
      extract.clean_hint(sample) == "**Hint:** Count the 3s.\n\nThen add them."
  )
  assert len(extract.clean_hint("x" * 5000)) == 5000
  wrapped = '```json\n{"hint": " Halve it. "}\n```'
  assert extract.clean_hint(wrapped) == " Halve it. "


def test_clean_hint_unwraps_json_and_label():
  rule = "first_paragraph"
  sample = '```json\n{"hint": "Halve the interval each turn."}\n```'
  assert extract.clean_hint(sample, rule) == "Halve the interval each turn."
  assert extract.clean_hint("**Hint:** Count the 3s.", rule) == "Count the 3s."
  assert extract.clean_hint("Hints are rare.", rule) == "Hints are rare."


def test_designer_messages_carry_document_examples_and_contract():
  class Doc:
    title = "heapq"
    text = "Heap queue algorithm."

  class Example:
    code = "class OldEnv: pass"
    stats = {"regret": 0.25, "win_rate_nohint": 0.5}
    verdict = {"valid": True}

  class Failure:
    code = "class BadEnv: pass"
    stats = {}
    verdict = {"valid": False, "reason": "reset", "message": "reset broke"}

  messages = design_prompts.designer_messages(Doc(), [Example(), Failure()])
  user = messages[1]["content"]
  assert messages[0]["role"] == "system"
  assert "Heap queue algorithm." in user
  assert "<REFERENCE_ENVIRONMENTS>" in user
  assert "win_rate: 0.50, regret: 0.25" in user and "class OldEnv" in user
  assert "rejected by validation (reset: reset broke): class BadEnv" in user
  assert "def step(self, action" in user and "def solution(self)" in user
  # The request comes last, after the memory block.
  assert user.rstrip().endswith("```python block.")
