"""Tool calls parsed from replies as the reference parses them."""

import json

from spade.environments import tool_calls


def _json_call(name, **arguments):
  payload = json.dumps({"name": name, "arguments": arguments})
  return f"<tool_call>{payload}</tool_call>"


def test_a_reply_with_three_calls_gives_three_in_order():
  reply = (
      "Let me look.\n"
      + _json_call("list_warehouses")
      + "\n"
      + _json_call("get_stock", warehouse="east", product="bolt")
      + _json_call("get_stock", warehouse="north", product="bolt")
      + "<|im_end|>"
  )
  assert tool_calls.parse_tool_calls(reply) == [
      {"name": "list_warehouses", "arguments": {}},
      {
          "name": "get_stock",
          "arguments": {"warehouse": "east", "product": "bolt"},
      },
      {
          "name": "get_stock",
          "arguments": {"warehouse": "north", "product": "bolt"},
      },
  ]


def test_xml_calls_with_typed_and_escaped_parameters():
  reply = (
      "<tool_call>\n<function=transfer>\n<parameter=amount>12.5</parameter>\n"
      "<parameter=note>rent &amp; fees</parameter>\n"
      "<parameter=urgent>true</parameter>\n</function>\n</tool_call>"
  )
  assert tool_calls.parse_tool_calls(reply) == [
      {
          "name": "transfer",
          "arguments": {"amount": 12.5, "note": "rent & fees", "urgent": True},
      }
  ]


def test_other_json_shapes_and_unparsable_blocks():
  reply = (
      '<tool_call>{"name": "a", "parameters": {"x": 1}}</tool_call>'
      '<tool_call>{"name": "b", "arguments": "{\\"y\\": 2}"}</tool_call>'
      "<tool_call>{not json</tool_call>"
      '<tool_call>{"arguments": {}}</tool_call>'
      '<tool_call>{"name": "c", "arguments": [1, 2]}</tool_call>'
  )
  # A list of arguments is kept: execute_tool then answers with its error,
  # as upstream.
  assert tool_calls.parse_tool_calls(reply) == [
      {"name": "a", "arguments": {"x": 1}},
      {"name": "b", "arguments": {"y": 2}},
      {"name": "c", "arguments": [1, 2]},
  ]
  assert tool_calls.parse_tool_calls("no calls here") == []


def test_parse_answer():
  assert tool_calls.parse_answer("so <answer> 42 </answer>.") == "42"
  assert tool_calls.parse_answer("<answer>\na\nb</answer>") == "a\nb"
  assert tool_calls.parse_answer("42") is None


def test_reply_actions_follow_the_reference_rules():
  two = _json_call("a", x=1) + _json_call("b")
  assert tool_calls.reply_actions(two, has_tools=True) == [
      ("tool", {"name": "a", "arguments": {"x": 1}}),
      ("tool", {"name": "b", "arguments": {}}),
  ]
  # An answer goes to step() even beside calls; so does a reply without a
  # parsable call, and every reply to a game without tools.
  for reply in (two + "<answer>7</answer>", "<tool_call>{oops</tool_call>"):
    assert tool_calls.reply_actions(reply, has_tools=True) == [("step", reply)]
  assert tool_calls.reply_actions(two, has_tools=False) == [("step", two)]
