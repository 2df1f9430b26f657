"""Seed environment (tool use): total a customer's delivered orders."""

import json
import random


def _call(name, **arguments):
  return (
      "<tool_call>"
      + json.dumps({"name": name, "arguments": arguments})
      + "</tool_call>"
  )


_CUSTOMERS = ["alice", "bruno", "chen", "dara", "emil", "fatima"]
_STATUSES = ["delivered", "shipped", "cancelled", "delivered", "returned"]


class OrderLookupEnv(ToolUseBaseEnv):
  """A retail back office: find what one customer spent on delivered orders.

  Tools list a customer's orders and show each order's status and price;
  only delivered orders count. Answer the total in dollars.
  """

  def __init__(self, max_turns=16, **kwargs):
    super().__init__(max_turns=max_turns, **kwargs)

  def reset(self, seed=None):
    rng = random.Random(seed)
    self.turn_count = 0
    self._call_history = []
    orders = {}
    for n in range(24):
      oid = f"O{1000 + n * 7 + rng.randint(0, 6)}"
      orders[oid] = {
          "customer": rng.choice(_CUSTOMERS),
          "status": rng.choice(_STATUSES),
          "price": round(rng.uniform(5, 250), 2),
      }
    self._customer = rng.choice(_CUSTOMERS)
    mine = [o for o, v in orders.items() if v["customer"] == self._customer]
    if not any(orders[o]["status"] == "delivered" for o in mine):
      orders[mine[0] if mine else "O0999"] = {
          "customer": self._customer,
          "status": "delivered",
          "price": 42.5,
      }
    self._state = {"orders": orders}
    self._expected_answer = "%.2f" % sum(
        v["price"]
        for v in orders.values()
        if v["customer"] == self._customer and v["status"] == "delivered"
    )
    self._tools = {
        "list_orders": {
            "description": "List the order ids of a customer",
            "parameters": {
                "type": "object",
                "properties": {"customer": {"type": "string"}},
                "required": ["customer"],
            },
        },
        "get_order": {
            "description": "Status and price of one order",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}},
                "required": ["order_id"],
            },
        },
        "get_weather": {
            "description": "Today's weather (not needed here)",
            "parameters": {"type": "object", "properties": {}},
        },
    }
    return (
        f"TASK: How much did customer '{self._customer}' spend on delivered"
        " orders? Use the tools, then answer with <answer>123.45</answer>.",
        {},
    )

  def _mine(self):
    return sorted(
        o
        for o, v in self._state["orders"].items()
        if v["customer"] == self._customer
    )

  def tool_list_orders(self, customer=""):
    ids = sorted(
        o
        for o, v in self._state["orders"].items()
        if v["customer"] == str(customer).lower()
    )
    return json.dumps(ids)

  def tool_get_order(self, order_id=""):
    o = self._state["orders"].get(order_id)
    if o is None:
      return f"Error: no order {order_id!r}"
    return json.dumps(
        {"order_id": order_id, "status": o["status"], "price": o["price"]}
    )

  def tool_get_weather(self):
    return "Sunny, 21C."

  def hint(self):
    n = sum(
        self._state["orders"][o]["status"] == "delivered" for o in self._mine()
    )
    return f"{self._customer} has {n} delivered orders."

  def solution(self):
    return (
        [_call("list_orders", customer=self._customer)]
        + [_call("get_order", order_id=o) for o in self._mine()]
        + [f"<answer>{self._expected_answer}</answer>"]
    )
