"""Code extraction from designer samples."""

from spade.designer import extract
from spade.designer import prompts


def test_prefers_block_with_class():
  sample = (
      "Here is the env:\n```python\nimport re\nclass FooEnv:\n  pass\n```\n"
      "Usage:\n```python\nenv = FooEnv()\nenv.reset(seed=1)\nprint(env)\n```"
  )
  assert extract.extract_code(sample) == "import re\nclass FooEnv:\n  pass\n"


def test_unterminated_fence_and_bare_code():
  assert extract.extract_code("```python\nclass AEnv:\n  x = 1") == (
      "class AEnv:\n  x = 1\n"
  )
  assert extract.extract_code("Sure!\nimport math\nclass BEnv: pass\n") == (
      "import math\nclass BEnv: pass\n"
  )
  # No code at all: returned as is so the validator reports why.
  assert extract.extract_code("no code here") == "no code here"


def test_clean_hint_keeps_first_paragraph():
  assert extract.clean_hint("  Count the 3s.\n\nExtra words") == "Count the 3s."
  assert len(extract.clean_hint("x" * 5000)) == 600


def test_clean_hint_unwraps_json_and_label():
  sample = '```json\n{"hint": "Halve the interval each turn."}\n```'
  assert extract.clean_hint(sample) == "Halve the interval each turn."
  assert extract.clean_hint("**Hint:** Count the 3s.") == "Count the 3s."
  assert extract.clean_hint("Hints are rare.") == "Hints are rare."


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

  messages = prompts.designer_messages(Doc(), [Example(), Failure()])
  user = messages[1]["content"]
  assert messages[0]["role"] == "system"
  assert "Heap queue algorithm." in user
  assert "<REFERENCE_ENVIRONMENTS>" in user
  assert "win_rate: 0.50, regret: 0.25" in user and "class OldEnv" in user
  assert "rejected by validation (reset: reset broke): class BadEnv" in user
  assert "def step(self, action" in user and "def solution(self)" in user
  # The request comes last, after the memory block.
  assert user.rstrip().endswith("```python block.")
