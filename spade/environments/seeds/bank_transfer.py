"""Seed environment (tool use): a multi-step banking request, BFCL style."""

import json
import random


def _call(name, **arguments):
  return (
      "<tool_call>"
      + json.dumps({"name": name, "arguments": arguments})
      + "</tool_call>"
  )


class BankTransferEnv(ToolUseBaseEnv):
  """A banking assistant follows instructions revealed one at a time.

  Check balances, top up the checking account from savings so an overdue
  invoice can be paid, pay it, then submit done. Each step's instruction
  appears once the previous one is complete.
  """

  def __init__(self, max_turns=10, **kwargs):
    super().__init__(max_turns=max_turns, **kwargs)

  def reset(self, seed=None):
    rng = random.Random(seed)
    self.turn_count = 0
    self._call_history = []
    invoices = {}
    for _ in range(4):
      iid = f"INV-{rng.randint(100, 999)}"
      invoices[iid] = {
          "amount": rng.randint(200, 900),
          "status": rng.choice(["paid", "open"]),
      }
    overdue = rng.choice(sorted(invoices))
    invoices[overdue]["status"] = "overdue"
    need = invoices[overdue]["amount"]
    self._state = {
        "accounts": {
            "checking": rng.randint(20, need - 50),
            "savings": rng.randint(need + 200, need + 2000),
        },
        "invoices": invoices,
        "checked": False,
    }
    self._overdue = overdue
    self._user_messages = [
        "Check the balances of my accounts.",
        "Move just enough from savings so checking can pay my overdue"
        " invoice.",
        "Now pay the overdue invoice from checking.",
    ]
    self._message_criteria = [
        lambda s: s["checked"],
        lambda s: s["accounts"]["checking"] == need,
        lambda s: s["invoices"][overdue]["status"] == "paid",
    ]
    self._current_msg = 0
    self._expected_answer = "done"
    self._tools = {
        "get_balances": {
            "description": "Balances of checking and savings",
            "parameters": {"type": "object", "properties": {}},
        },
        "list_invoices": {
            "description": "All invoices with amount and status",
            "parameters": {"type": "object", "properties": {}},
        },
        "transfer": {
            "description": "Move money between accounts",
            "parameters": {
                "type": "object",
                "properties": {
                    "from_account": {"type": "string"},
                    "to_account": {"type": "string"},
                    "amount": {"type": "integer"},
                },
                "required": ["from_account", "to_account", "amount"],
            },
        },
        "pay_invoice": {
            "description": "Pay an invoice from checking",
            "parameters": {
                "type": "object",
                "properties": {"invoice_id": {"type": "string"}},
                "required": ["invoice_id"],
            },
        },
    }
    return (
        f"{self._user_messages[0]} (Submit <answer>done</answer> when every"
        " instruction is complete.)",
        {},
    )

  def _advance_if_done(self):
    if self._current_msg >= len(self._user_messages):
      return ""
    if self._message_criteria[self._current_msg](self._state):
      self._current_msg += 1
      if self._current_msg >= len(self._user_messages):
        return "\n\n[ALL STEPS COMPLETE] Submit <answer>done</answer>."
      nxt = self._user_messages[self._current_msg]
      step = self._current_msg
      return f"\n\n[STEP {step} COMPLETE — NEW INSTRUCTION] {nxt}"
    return ""

  def _check_answer(self, answer):
    return answer.strip().lower() == "done" and self._current_msg >= len(
        self._user_messages
    )

  def tool_get_balances(self):
    self._state["checked"] = True
    return json.dumps(self._state["accounts"]) + self._advance_if_done()

  def tool_list_invoices(self):
    return json.dumps(self._state["invoices"]) + self._advance_if_done()

  def tool_transfer(self, from_account="", to_account="", amount=0):
    acc = self._state["accounts"]
    try:
      amount = int(amount)
    except (TypeError, ValueError):
      return "Error: amount must be an integer" + self._advance_if_done()
    if from_account not in acc or to_account not in acc or amount <= 0:
      return "Error: bad accounts or amount" + self._advance_if_done()
    if acc[from_account] < amount:
      return "Error: insufficient funds" + self._advance_if_done()
    acc[from_account] -= amount
    acc[to_account] += amount
    return f"Transferred {amount}. " + json.dumps(acc) + self._advance_if_done()

  def tool_pay_invoice(self, invoice_id=""):
    inv = self._state["invoices"].get(invoice_id)
    if inv is None or inv["status"] == "paid":
      return (
          f"Error: no unpaid invoice {invoice_id!r}" + self._advance_if_done()
      )
    if self._state["accounts"]["checking"] < inv["amount"]:
      return "Error: insufficient funds in checking" + self._advance_if_done()
    self._state["accounts"]["checking"] -= inv["amount"]
    inv["status"] = "paid"
    return f"Paid {invoice_id}." + self._advance_if_done()

  def hint(self):
    return f"The overdue invoice is {self._overdue}."

  def solution(self):
    acc = self._state["accounts"]
    need = self._state["invoices"][self._overdue]["amount"]
    return [
        _call("get_balances"),
        _call("list_invoices"),
        _call(
            "transfer",
            from_account="savings",
            to_account="checking",
            amount=need - acc["checking"],
        ),
        _call("pay_invoice", invoice_id=self._overdue),
        "<answer>done</answer>",
    ]
