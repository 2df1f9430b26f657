"""Seed environment (tool use): aggregate a staff table through queries."""

import json
import random


def _call(name, **arguments):
  return (
      "<tool_call>"
      + json.dumps({"name": name, "arguments": arguments})
      + "</tool_call>"
  )


_DEPTS = ["sales", "research", "support", "finance", "legal"]
_NAMES = [
    "ana",
    "ben",
    "cai",
    "dev",
    "eva",
    "fox",
    "gil",
    "hui",
    "ida",
    "jon",
    "kim",
    "leo",
    "mei",
    "nia",
    "oto",
    "pia",
    "raj",
    "sam",
    "tia",
    "uma",
]


class TableQueryEnv(ToolUseBaseEnv):
  """An analyst answers a question about a staff table using query tools.

  Find the department with the most employees and answer its average
  salary, rounded to the nearest integer.
  """

  def __init__(self, max_turns=12, **kwargs):
    super().__init__(max_turns=max_turns, **kwargs)

  def reset(self, seed=None):
    rng = random.Random(seed)
    self.turn_count = 0
    self._call_history = []
    while True:
      rows = [
          {
              "name": n,
              "dept": rng.choice(_DEPTS),
              "salary": rng.randrange(40_000, 120_000, 500),
          }
          for n in _NAMES
      ]
      counts = {d: sum(r["dept"] == d for r in rows) for d in _DEPTS}
      top = max(counts.values())
      if list(counts.values()).count(top) == 1:
        break
    self._dept = max(counts, key=counts.get)
    pay = [r["salary"] for r in rows if r["dept"] == self._dept]
    self._state = {"rows": rows}
    self._expected_answer = str(round(sum(pay) / len(pay)))
    self._tools = {
        "count_by_department": {
            "description": "Number of employees per department",
            "parameters": {"type": "object", "properties": {}},
        },
        "list_employees": {
            "description": "Employees (name, salary) of one department",
            "parameters": {
                "type": "object",
                "properties": {"department": {"type": "string"}},
                "required": ["department"],
            },
        },
        "max_salary": {
            "description": "The highest salary in the company",
            "parameters": {"type": "object", "properties": {}},
        },
    }
    return (
        "TASK: Which department has the most employees? Answer its average"
        " salary rounded to the nearest integer: <answer>N</answer>.",
        {},
    )

  def tool_count_by_department(self):
    return json.dumps(
        {d: sum(r["dept"] == d for r in self._state["rows"]) for d in _DEPTS}
    )

  def tool_list_employees(self, department=""):
    rows = [
        {"name": r["name"], "salary": r["salary"]}
        for r in self._state["rows"]
        if r["dept"] == str(department).lower()
    ]
    return json.dumps(rows) if rows else f"Error: no department {department!r}"

  def tool_max_salary(self):
    return str(max(r["salary"] for r in self._state["rows"]))

  def hint(self):
    return f"The largest department is {self._dept}."

  def solution(self):
    return [
        _call("count_by_department"),
        _call("list_employees", department=self._dept),
        f"<answer>{self._expected_answer}</answer>",
    ]
