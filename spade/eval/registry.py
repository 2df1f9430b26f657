"""What a suite is, what it returns, and the table of suites by name.

A suite turns a `Responder` (chat messages in, assistant replies out) into a
score in [0, 1]. Single-turn suites are a `SingleTurnSuite`: items, one
prompt per item, one batched `respond` call, a scorer per reply. Multi-turn
suites implement `run` themselves.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
from typing import Any, Callable, Protocol, Sequence

import ml_collections

Messages = list[dict[str, str]]
Log = Callable[[str], None]


class Responder(Protocol):
  """The agent seen by a suite: one assistant reply per chat prompt."""

  def respond(self, prompts: Sequence[Messages]) -> list[str]:
    """Returns one reply per prompt, in order.

    Args:
      prompts: chat message lists ({"role", "content"} dicts, system first
        when present), each ending with a user turn.
    """
    ...


class EvalError(RuntimeError):
  """A suite cannot run (bad name, missing data or sandbox): says what to do."""


@dataclasses.dataclass(frozen=True)
class ItemResult:
  """The score of one evaluated item (a question, a problem, an episode)."""

  item_id: str
  score: float
  reply: str
  detail: str = ""
  group: str = ""  # category / environment, for the per-group means

  def log_line(self, suite: str) -> str:
    """One human-readable line for the per-item log."""
    reply = " ".join(self.reply.split())
    if len(reply) > 60:
      reply = reply[:57] + "..."
    return (
        f"[{suite}] {self.item_id}: score={self.score:.3f}"
        f" ({self.detail}) reply={reply!r}"
    )


@dataclasses.dataclass(frozen=True)
class SuiteResult:
  """A suite's outcome: mean item score plus what the data source was."""

  suite: str
  items: tuple[ItemResult, ...]
  info: dict[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def score(self) -> float:
    """Mean item score; 0.0 for an empty suite."""
    if not self.items:
      return 0.0
    return sum(i.score for i in self.items) / len(self.items)

  @property
  def num_examples(self) -> int:
    """How many items were scored."""
    return len(self.items)

  def by_group(self) -> dict[str, float]:
    """Mean score per item group (category, environment), sorted by name."""
    groups: dict[str, list[float]] = {}
    for item in self.items:
      if item.group:
        groups.setdefault(item.group, []).append(item.score)
    return {g: sum(s) / len(s) for g, s in sorted(groups.items())}

  def summary(self) -> dict[str, Any]:
    """The JSON-able summary the CLI prints as its last line."""
    return {
        "suite": self.suite,
        "score": self.score,
        "num_examples": self.num_examples,
        "num_full_score": sum(1 for i in self.items if i.score >= 1.0),
        "by_group": self.by_group(),
        **self.info,
    }


class Suite(Protocol):
  """An evaluation suite. `needs_pool`: whether `run` needs a SandboxPool."""

  name: str
  needs_pool: bool

  def run(
      self,
      responder: Responder,
      *,
      num_examples: int,
      pool: Any = None,
      log: Log = print,
  ) -> SuiteResult:
    """Evaluates `responder` on the first `num_examples` items."""
    ...


class SingleTurnSuite:
  """Base of suites that ask one question per item and score one reply."""

  name = ""
  needs_pool = False

  def items(self, num_examples: int) -> list[Any]:
    """The first `num_examples` items of the suite's fixed item order."""
    raise NotImplementedError

  def prompt(self, item: Any) -> Messages:
    """The chat messages that pose `item`."""
    raise NotImplementedError

  def score(
      self, items: Sequence[Any], replies: Sequence[str], pool: Any = None
  ) -> list[ItemResult]:
    """Scores each reply against its item; 1.0 is fully correct."""
    raise NotImplementedError

  def info(self) -> dict[str, Any]:
    """Extra fields for the summary (e.g. which data source was used)."""
    return {}

  def run(
      self,
      responder: Responder,
      *,
      num_examples: int,
      pool: Any = None,
      log: Log = print,
  ) -> SuiteResult:
    """Poses every item in one `respond` call, scores and logs each reply."""
    if num_examples <= 0:
      raise EvalError(f"num_examples={num_examples} must be >= 1")
    if self.needs_pool and pool is None:
      raise EvalError(
          f"suite {self.name!r} executes code and needs a SandboxPool"
          " (spade.environments.sandboxes.from_config(config.sandbox))"
      )
    items = self.items(num_examples)
    replies = responder.respond([self.prompt(item) for item in items])
    if len(replies) != len(items):
      raise EvalError(
          f"the responder returned {len(replies)} replies for"
          f" {len(items)} prompts"
      )
    results = self.score(items, replies, pool)
    for result in results:
      log(result.log_line(self.name))
    return SuiteResult(self.name, tuple(results), self.info())


# Suite name -> "module:factory"; factories take the config's `eval` section.
# Imported lazily so that `reasoning_gym` (slow to import) loads only when
# its suite runs.
SUITES = {
    "reasoning_gym": "spade.eval.reasoning_gym_suite:ReasoningGymSuite",
    "rg_hard": "spade.eval.rg_hard_suite:RGHardSuite",
    "humaneval": "spade.eval.humaneval_suite:HumanEvalSuite",
    "tool_use": "spade.eval.tool_use_suite:ToolUseSuite",
    "seed_heldout": "spade.eval.seed_heldout_suite:SeedHeldoutSuite",
}


def eval_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config.eval` with its "0: use the agent's value" keys resolved."""
  section = copy.deepcopy(config.eval)
  with section.unlocked():
    if section.max_turns <= 0:
      section.max_turns = config.agent.max_turns
    if section.max_new_tokens <= 0:
      section.max_new_tokens = config.agent.max_new_tokens
    # Held-out games are prompted as training prompts them.
    section.prompt_style = config.agent.prompt_style
  return section


def build_suite(name: str, eval_config: Any) -> Suite:
  """Returns the suite `name` built from `config.eval`.

  Raises:
    EvalError: `name` is not a registered suite.
  """
  if name not in SUITES:
    raise EvalError(f"unknown suite {name!r}; choose one of {sorted(SUITES)}")
  module_name, factory = SUITES[name].split(":")
  module = importlib.import_module(module_name)
  return getattr(module, factory)(eval_config)
