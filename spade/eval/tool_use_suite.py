"""Function-calling accuracy, BFCL-style.

Data: the BFCL v4 `simple_python` and `multiple` categories
(`config.eval.bfcl_categories`), read from the `bfcl-eval` wheel that
`bfcl.fetch_wheel` downloads once into `config.eval.bfcl_cache_dir` (never
installed). When the wheel cannot be obtained (no network, downloading
disabled) the suite says so in its log and falls back to SPADE's own held-out
function-calling set (`tool_use_heldout.ITEMS`); the summary's `source` field
records which was used ("bfcl_v4" or "spade_heldout").

Items: each category is shuffled with `config.eval.seed` and the categories
are interleaved, so any `num_examples` is a fixed, mixed sample. The agent
sees the functions as JSON schemas and answers with `<tool_call>` blocks (the
environments' tool-use protocol); `bfcl.check_calls` scores 1 or 0.
"""

from __future__ import annotations

import json
import random
from typing import Any, Sequence

from spade.eval import answers
from spade.eval import bfcl
from spade.eval import registry
from spade.eval import tool_use_heldout

SYSTEM = (
    "You can call the functions below. To call one, reply with"
    ' <tool_call>{"name": <function name>, "arguments": {<parameter>:'
    " <value>, ...}}</tool_call>, one block per call, and nothing else."
    "\n\nFunctions:\n"
)


class ToolUseSuite(registry.SingleTurnSuite):
  """BFCL v4 single-turn function calling (or SPADE's own held-out set)."""

  name = "tool_use"
  needs_pool = False

  def __init__(self, eval_config):
    self.categories = tuple(eval_config.bfcl_categories)
    self.seed = int(eval_config.seed)
    self.cache_dir = eval_config.bfcl_cache_dir or bfcl.default_cache_dir()
    self.download = bool(eval_config.bfcl_download)
    self.source = None
    self._log: registry.Log = print

  def _load(self) -> list[dict]:
    """Entries of the BFCL categories, or the own set; sets `self.source`."""
    try:
      wheel = bfcl.fetch_wheel(self.cache_dir, download=self.download)
      by_category = [bfcl.load_category(wheel, c) for c in self.categories]
    except bfcl.BfclUnavailable as e:
      self.source = "spade_heldout"
      self._log(
          f"[tool_use] BFCL v4 data unavailable ({e}); using SPADE's own"
          f" held-out function-calling set ({len(tool_use_heldout.ITEMS)}"
          " items)"
      )
      return [dict(item) for item in tool_use_heldout.ITEMS]
    self.source = "bfcl_v4"
    self._log(
        f"[tool_use] using BFCL v4 data from {wheel}, categories"
        f" {list(self.categories)}"
    )
    rng = random.Random(self.seed)
    for entries in by_category:
      rng.shuffle(entries)
    mixed = []
    for i in range(max(len(e) for e in by_category)):
      mixed.extend(e[i] for e in by_category if i < len(e))
    return mixed

  def items(self, num_examples: int) -> list[dict]:
    """The first `num_examples` entries (fewer if the set is smaller)."""
    entries = self._load()
    if num_examples > len(entries):
      self._log(
          f"[tool_use] only {len(entries)} items available, evaluating all"
      )
    return entries[:num_examples]

  def prompt(self, item: dict) -> registry.Messages:
    functions = json.dumps(item["function"], indent=1)
    return [{"role": "system", "content": SYSTEM + functions}] + [
        {"role": m["role"], "content": m["content"]}
        for m in item["question"][0]
    ]

  def score(
      self,
      items: Sequence[dict],
      replies: Sequence[str],
      pool: Any = None,
  ) -> list[registry.ItemResult]:
    del pool
    results = []
    for item, reply in zip(items, replies):
      calls = answers.parse_tool_calls(reply)
      ok, reason = bfcl.check_calls(
          item["function"], calls, item["ground_truth"]
      )
      results.append(
          registry.ItemResult(
              item["id"],
              1.0 if ok else 0.0,
              reply,
              reason,
              item["id"].rsplit("_", 1)[0],
          )
      )
    return results

  def info(self) -> dict[str, Any]:
    return {"source": self.source}

  def run(
      self,
      responder: registry.Responder,
      *,
      num_examples: int,
      pool: Any = None,
      log: registry.Log = print,
  ) -> registry.SuiteResult:
    """As `SingleTurnSuite.run`; the data-source line goes to `log` too."""
    self._log = log
    return super().run(responder, num_examples=num_examples, pool=pool, log=log)
