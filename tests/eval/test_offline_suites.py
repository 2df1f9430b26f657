"""Planted-answer tests of the suites that need no sandbox.

A known-correct reply must score 1.0 and a known-wrong one 0.0, through the
same `run` path the CLI uses.
"""

import json

import pytest

from spade.eval import bfcl
from spade.eval import registry
from spade.eval import runner
from spade.eval import tool_use_heldout


@pytest.fixture(scope="module")
def rg_answers():
  """question -> expected answer for the first 8 reasoning-gym items."""
  from spade import config as config_lib  # pylint: disable=g-import-not-at-top

  suite = runner.build("reasoning_gym", config_lib.base_config())
  return {it.entry["question"]: it.entry["answer"] for it in suite.items(8)}


def test_reasoning_gym_items_are_fixed_and_cover_categories(config):
  suite = runner.build("reasoning_gym", config)
  items = suite.items(10)
  cats = config.eval.reasoning_gym_categories
  assert [it.category for it in items] == [cats[i % 8] for i in range(10)]
  assert [it.index for it in items] == [0] * 8 + [1, 1]
  again = runner.build("reasoning_gym", config).items(10)
  assert [it.entry["question"] for it in items] == [
      it.entry["question"] for it in again
  ]


def test_reasoning_gym_scores_planted_answers(config, scripted, rg_answers):
  right = scripted(
      lambda m: f"thinking...\n<answer>{rg_answers[m[-1]['content']]}</answer>"
  )
  lines = []
  result = runner.evaluate(
      "reasoning_gym", config, right, num_examples=8, log=lines.append
  )
  assert result.score == 1.0
  assert result.num_examples == 8
  assert right.calls == [8]  # one batched call
  assert len(lines) == 8 and all("score=1.000" in line for line in lines)
  summary = result.summary()
  assert summary["suite"] == "reasoning_gym" and summary["num_full_score"] == 8
  json.dumps(summary)

  wrong = scripted(lambda m: "<answer>no idea</answer>")
  result = runner.evaluate(
      "reasoning_gym", config, wrong, num_examples=8, log=lambda _: None
  )
  assert result.score == 0.0


def test_reasoning_gym_boxed_and_last_line_answers(
    config, scripted, rg_answers
):
  boxed = scripted(lambda m: f"\\boxed{{{rg_answers[m[-1]['content']]}}}")
  result = runner.evaluate(
      "reasoning_gym", config, boxed, num_examples=4, log=lambda _: None
  )
  assert result.score == 1.0
  mixed = scripted(
      lambda m: f"Answer: {rg_answers[m[-1]['content']]}"
      if "Calculate" in m[-1]["content"]
      else "hmm"
  )
  result = runner.evaluate(
      "reasoning_gym", config, mixed, num_examples=8, log=lambda _: None
  )
  assert result.score == pytest.approx(1 / 8)  # basic_arithmetic only
  by_group = result.summary()["by_group"]
  assert sorted(by_group) == sorted(config.eval.reasoning_gym_categories)
  assert by_group["basic_arithmetic"] == 1.0
  assert sum(by_group.values()) == 1.0


def _planted_call(entry):
  """A correct tool call built from an entry's first possible answers."""

  def first(options):
    value = next(o for o in options if o != "")
    if isinstance(value, dict):
      return {k: first(v) for k, v in value.items() if any(o != "" for o in v)}
    return value

  (truth,) = entry["ground_truth"]
  ((name, params),) = truth.items()
  args = {p: first(o) for p, o in params.items() if any(x != "" for x in o)}
  return (
      f'<tool_call>{json.dumps({"name": name, "arguments": args})}</tool_call>'
  )


def test_tool_use_fallback_scores_planted_answers(config, scripted, tmp_path):
  config.eval.bfcl_download = False
  config.eval.bfcl_cache_dir = str(tmp_path)  # empty: no BFCL wheel
  by_question = {
      e["question"][0][0]["content"]: e for e in tool_use_heldout.ITEMS
  }
  right = scripted(lambda m: _planted_call(by_question[m[-1]["content"]]))
  lines = []
  result = runner.evaluate(
      "tool_use", config, right, num_examples=8, log=lines.append
  )
  assert "held-out function-calling set" in lines[0]
  assert result.info["source"] == "spade_heldout"
  assert result.score == 1.0 and result.num_examples == 8
  assert result.by_group() == {"spade_multiple": 1.0, "spade_simple": 1.0}

  wrong = scripted(
      lambda m: '<tool_call>{"name": "get_weather", "arguments":'
      ' {"city": "Atlantis"}}</tool_call>'
  )
  result = runner.evaluate(
      "tool_use", config, wrong, num_examples=12, log=lambda _: None
  )
  assert result.score == 0.0 and result.num_examples == 12


def test_tool_use_prompt_lists_functions(config, tmp_path):
  config.eval.bfcl_download = False
  config.eval.bfcl_cache_dir = str(tmp_path)
  suite = runner.build("tool_use", config)
  (item,) = suite.items(1)
  messages = suite.prompt(item)
  assert messages[0]["role"] == "system"
  assert '"name": "get_weather"' in messages[0]["content"]
  assert messages[1] == {
      "role": "user",
      "content": item["question"][0][0]["content"],
  }


def test_tool_use_on_bfcl_v4_data(config, scripted):
  """The real BFCL v4 data, when the wheel is cached or downloadable."""
  try:
    bfcl.fetch_wheel(bfcl.default_cache_dir())
  except bfcl.BfclUnavailable as e:
    pytest.skip(f"BFCL wheel unavailable here: {e}")
  suite = runner.build("tool_use", config)
  items = suite.items(8)
  assert suite.source == "bfcl_v4"
  assert [it["id"].split("_")[0] for it in items] == ["simple", "multiple"] * 4
  by_question = {it["question"][0][-1]["content"]: it for it in items}
  right = scripted(lambda m: _planted_call(by_question[m[-1]["content"]]))
  result = suite.run(right, num_examples=8, log=lambda _: None)
  assert result.score == 1.0 and result.info["source"] == "bfcl_v4"
  wrong = scripted(lambda m: "I would rather not call anything.")
  assert suite.run(wrong, num_examples=8, log=lambda _: None).score == 0.0


def test_unknown_suite_is_a_clear_error(config):
  with pytest.raises(registry.EvalError, match="choose one of"):
    runner.build("mmlu", config)
