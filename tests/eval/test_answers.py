"""Tests for reading answers, code and tool calls out of replies."""

from spade.eval import answers


def test_answer_tag_wins_over_boxed_and_last_line():
  reply = "I think \\boxed{3}.\n<answer> 42 </answer>\nso 7"
  assert answers.extract_answer(reply) == "42"


def test_last_answer_tag_is_used():
  assert answers.extract_answer("<answer>1</answer> <answer>2</answer>") == "2"


def test_boxed_with_nested_braces():
  reply = "so the result is \\boxed{\\frac{1}{2}} done"
  assert answers.extract_answer(reply) == "\\frac{1}{2}"


def test_unclosed_last_boxed_falls_back_to_earlier_one():
  assert answers.extract_answer("\\boxed{5} then \\boxed{6") == "5"


def test_last_line_with_prefix_removed():
  assert answers.extract_answer("work\nwork\nFinal answer: 17\n\n") == "17"
  assert answers.extract_answer("   \n") == ""


def test_extract_code_prefers_block_defining_entry_point():
  reply = (
      "Helper:\n```python\nx = 1\n```\nSolution:\n```python\n"
      "def f(a):\n    return a\n```"
  )
  assert answers.extract_code(reply, "f") == "def f(a):\n    return a\n"
  assert answers.extract_code(reply) == "x = 1\n"
  assert answers.extract_code("    return 3\n") == "    return 3\n"


def test_extract_code_ignores_other_languages_and_unclosed_fence():
  reply = "```bash\nls\n```\n```python\nreturn 1"
  assert answers.extract_code(reply) == "return 1"


def test_parse_tool_calls():
  reply = (
      '<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>'
      '<tool_call>{"name": "b", "parameters": "{\\"y\\": [2]}"}</tool_call>'
      "<tool_call>not json</tool_call>"
      '<tool_call>{"arguments": {}}</tool_call>'
      '<tool_call>{"name": "c", "arguments": [1]}</tool_call>'
  )
  assert answers.parse_tool_calls(reply) == [("a", {"x": 1}), ("b", {"y": [2]})]
  assert answers.parse_tool_calls("no calls") == []
