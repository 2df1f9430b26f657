r"""Procedural reasoning from the `reasoning-gym` package, generated offline.

Items are a fixed function of `config.eval.seed` and
`config.eval.reasoning_gym_categories`: item i is entry i // C of category
i % C (C categories), so any `num_examples` covers the categories evenly.
Each reply is scored by the task's own verifier (`dataset.score_answer`) on
the answer read by `answers.extract_answer` (the last `<answer>` tag, else
the last `\boxed{}`, else the last line); partial credit, where the verifier
gives it, is kept.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from spade.eval import answers
from spade.eval import registry

SYSTEM = (
    "Solve the task. Think briefly, then give only the final answer inside"
    " <answer>...</answer>."
)


@dataclasses.dataclass(frozen=True)
class RGItem:
  """One generated task: its category, index, entry and verifier."""

  category: str
  index: int
  entry: dict
  dataset: Any

  @property
  def item_id(self) -> str:
    """ "<category>/<index>", e.g. "chain_sum/0"."""
    return f"{self.category}/{self.index}"


class ReasoningGymSuite(registry.SingleTurnSuite):
  """Reasoning-gym tasks over several categories, scored by their verifiers."""

  name = "reasoning_gym"
  needs_pool = False

  def __init__(self, eval_config):
    self.categories = tuple(eval_config.reasoning_gym_categories)
    self.seed = int(eval_config.seed)
    if not self.categories:
      raise registry.EvalError(
          "config.eval.reasoning_gym_categories is empty; name at least one"
          " reasoning-gym dataset, e.g. ('basic_arithmetic', 'chain_sum')"
      )

  def items(self, num_examples: int) -> list[RGItem]:
    """Item i is entry i // C of category i % C; fixed by the seed."""
    try:
      import reasoning_gym  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise registry.EvalError(
          "the reasoning_gym suite needs the `reasoning-gym` package:"
          " pip install 'spade[eval]'"
      ) from e
    per_category = -(-num_examples // len(self.categories))
    datasets = {}
    for offset, category in enumerate(self.categories):
      try:
        # A distinct seed per category keeps categories independent of the
        # order they are listed in.
        datasets[category] = reasoning_gym.create_dataset(
            category, size=per_category, seed=self.seed + offset
        )
      except (KeyError, ValueError) as e:
        raise registry.EvalError(
            f"reasoning-gym has no usable dataset {category!r} ({e}); fix"
            " config.eval.reasoning_gym_categories"
        ) from e
    result = []
    for i in range(num_examples):
      category = self.categories[i % len(self.categories)]
      index = i // len(self.categories)
      dataset = datasets[category]
      result.append(RGItem(category, index, dataset[index], dataset))
    return result

  def prompt(self, item: RGItem) -> registry.Messages:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": item.entry["question"]},
    ]

  def score(
      self,
      items: Sequence[RGItem],
      replies: Sequence[str],
      pool: Any = None,
  ) -> list[registry.ItemResult]:
    del pool
    results = []
    for item, reply in zip(items, replies):
      answer = answers.extract_answer(reply)
      value = float(item.dataset.score_answer(answer, item.entry))
      value = min(1.0, max(0.0, value))
      results.append(
          registry.ItemResult(
              item.item_id,
              value,
              reply,
              f"answer={answer[:40]!r} expected={item.entry['answer'][:40]!r}",
              item.category,
          )
      )
    return results

  def info(self) -> dict[str, Any]:
    return {"categories": list(self.categories)}
