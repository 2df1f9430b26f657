"""The model-based solvability audit (`spade.environments.audit`): the
reference's prompts and verdict rule, with a scripted model."""

import pytest

from spade.environments import audit

# A tool-use task whose last criterion needs a state no tool ever sets (the
# reference's own example of an impossible game), and its sound twin.
IMPOSSIBLE = """
class OrderEnv(ToolUseBaseEnv):
  def reset(self, seed=None):
    self._state = {"order_status": "new"}
    self._message_criteria = [lambda s: s["order_status"] == "completed"]
    return "Complete the order.", {}

  def tool_ship(self):
    self._state["order_status"] = "shipped"
    return "shipped"
"""
SOUND = IMPOSSIBLE.replace('"shipped"', '"completed"')


def scripted_model(chats):
  """Answers like a model that traces each criterion to a tool: no when
  nothing assigns "completed"."""
  replies = []
  for chat in chats:
    assert [m["role"] for m in chat] == ["system", "user"]
    code = chat[1]["content"]
    solvable = '["order_status"] = "completed"' in code
    replies.append(
        "Criterion 1 needs order_status == 'completed'. "
        + (
            "tool_ship sets it. \\boxed{yes}"
            if solvable
            else "No tool assigns it. \\boxed{no}"
        )
    )
  return replies


def test_the_audit_refuses_what_the_scripted_model_judges_unsolvable():
  (bad, bad_reply), (good, _) = audit.audit(
      [IMPOSSIBLE, SOUND], scripted_model, tool_use=True
  )
  assert not bad and good
  assert "No tool assigns it" in bad_reply
  message = audit.refusal_message(bad_reply)
  assert "\n" not in message and "No tool assigns it" in message


def test_the_chats_are_the_references():
  tool = audit.audit_messages(SOUND, tool_use=True)
  assert tool[0]["content"] == audit.TOOL_USE_SYSTEM
  assert tool[0]["content"].startswith(
      "You rigorously audit auto-generated Python tool-use game environments"
  )
  user = tool[1]["content"]
  assert f"```python\n{SOUND}\n```" in user
  assert user.endswith(
      "Answer \\boxed{no} if any success criterion is impossible or"
      " unwinnable by the above tests; else \\boxed{yes}."
  )
  game = audit.audit_messages(SOUND, tool_use=False)
  assert game[0]["content"] == audit.SYSTEM
  assert game[1]["content"].startswith("Is this game environment playable?")
  assert game[1]["content"].endswith(
      "Answer \\boxed{yes} unless there is a clear fatal bug, then"
      " \\boxed{no}."
  )


@pytest.mark.parametrize(
    "reply, keep",
    [
        ("\\boxed{yes}", True),
        ("\\boxed{ Y }", True),
        ("\\boxed{True}", True),
        ("\\boxed{no}", False),
        ("\\boxed{unsure}", False),
        ("first \\boxed{no}, then \\boxed{yes}", False),
        ("no verdict at all", True),  # no box: the reference keeps it
        ("", True),  # empty reply: kept
        (None, True),  # the call failed: kept
    ],
)
def test_the_verdict_rule_is_the_references(reply, keep):
  assert audit.keeps(reply) is keep


def test_unanswered_chats_keep_their_programs_and_counts_must_match():
  assert audit.audit([IMPOSSIBLE], lambda chats: [None], tool_use=True) == [
      (True, "")
  ]
  assert audit.audit([], scripted_model, tool_use=True) == []
  with pytest.raises(ValueError, match="1 replies for 2 chats"):
    audit.audit([SOUND, SOUND], lambda chats: ["\\boxed{yes}"], tool_use=True)
