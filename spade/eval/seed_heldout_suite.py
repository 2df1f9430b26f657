"""The seed environments kept out of training, played multi-turn in the sandbox.

The environments are the seed library's programs flagged `heldout=True`
(`spade.environments.library.seed_programs()`); training never samples them.
Episode i plays program i % P (P held-out programs) with seed
`config.eval.seed + i // P`, without a hint, for at most `config.eval.max_turns`
turns (0: `config.agent.max_turns`). The episodes are played by the training
rollout (`spade.agent.rollout.run_episodes` over a `PoolExecutor`):
the same prompts, the same truncation rule, tool calls through
`execute_tool`, one `respond` call per turn for all live episodes.

An episode's score is its total reward clipped to [0, 1]; an environment
that fails in the sandbox scores 0 and its reason is logged.
"""

from __future__ import annotations

import json
from typing import Any

from spade.agent import rollout
from spade.eval import registry


def heldout_programs() -> list[Any]:
  """The seed programs flagged `heldout`, in the library's order."""
  from spade.environments import library  # pylint: disable=g-import-not-at-top

  programs = [p for p in library.seed_programs() if p.heldout]
  if not programs:
    raise registry.EvalError(
        "the seed library has no program flagged heldout=True; the"
        " seed_heldout suite needs at least one (spade/environments/seeds/)"
    )
  return programs


class SeedHeldoutSuite:
  """Mean clipped return over held-out seed environments."""

  name = "seed_heldout"
  needs_pool = True

  def __init__(
      self,
      eval_config,
      *,
      max_turns: int | None = None,
      programs: list[Any] | None = None,
  ):
    """Configures the suite.

    Args:
      eval_config: `config.eval` (see `registry.eval_config`).
      max_turns: overrides `eval_config.max_turns`.
      programs: objects with `name` and `source` to play instead of the
        library's held-out programs (tests, ad-hoc evaluations).
    """
    self.seed = int(eval_config.seed)
    self._programs = programs
    turns = max_turns if max_turns is not None else eval_config.max_turns
    if turns <= 0:
      raise registry.EvalError(
          "seed_heldout needs a turn limit: set config.eval.max_turns > 0 (or"
          " build the suite with runner.build, which uses"
          " config.agent.max_turns)"
      )
    self.max_turns = int(turns)
    self.prompt_style = str(eval_config.get("prompt_style", "reference"))

  def episodes(self, num_examples: int) -> list[tuple[str, str, int]]:
    """(program name, source, seed) of each episode, in a fixed order."""
    programs = self._programs or heldout_programs()
    return [
        (
            programs[i % len(programs)].name,
            programs[i % len(programs)].source,
            self.seed + i // len(programs),
        )
        for i in range(num_examples)
    ]

  def run(
      self,
      responder: registry.Responder,
      *,
      num_examples: int,
      pool: Any = None,
      log: registry.Log = print,
  ) -> registry.SuiteResult:
    """Plays every episode to its end and scores each one's clipped return."""
    if num_examples <= 0:
      raise registry.EvalError(f"num_examples={num_examples} must be >= 1")
    if pool is None:
      raise registry.EvalError(
          "seed_heldout plays environments in the sandbox: pass a SandboxPool"
          " (spade.environments.sandboxes.from_config(config.sandbox))"
      )
    specs = self.episodes(num_examples)
    episodes, _ = rollout.run_episodes(
        [
            rollout.EpisodeSpec(i, source, seed, None, i)
            for i, (_, source, seed) in enumerate(specs)
        ],
        adaptor := _ResponderSampler(responder),
        rollout.PoolExecutor(pool),
        adaptor.render,
        max_turns=self.max_turns,
        max_context=int(getattr(responder, "max_prompt_tokens", 1 << 30)),
        seed=self.seed,
        prompt_style=self.prompt_style,
    )
    results = []
    for (name, _, seed), ep in zip(specs, episodes):
      score = min(1.0, max(0.0, ep.total_reward))
      detail = f"return={ep.total_reward:.2f} turns={len(ep.turns)}" + (
          f" error={ep.error}"[:300] if ep.error else ""
      )
      last = ep.turns[-1].action if ep.turns else ""
      result = registry.ItemResult(
          f"{name}/seed{seed}", score, last, detail, name
      )
      log(result.log_line(self.name))
      results.append(result)
    return registry.SuiteResult(
        self.name,
        tuple(results),
        {"environments": sorted({name for name, _, _ in specs})},
    )


class _ResponderSampler:
  """The rollout's token sampler over a suite's `Responder`.

  The rollout renders and truncates each prompt with `render`; this maps the
  ids back to the chat messages they came from and asks the responder, so
  evaluation plays through the training rollout with the training prompts.
  A `ModelResponder` renders with the checkpoint's chat format; other
  responders (scripted ones in tests) get the messages' JSON as bytes.
  """

  def __init__(self, responder: registry.Responder):
    self._responder = responder
    self._messages: dict[tuple[int, ...], list] = {}

  def render(self, messages: list[dict[str, str]]) -> list[int]:
    if hasattr(self._responder, "render"):
      ids = list(self._responder.render(messages))
    else:
      ids = list(json.dumps(messages).encode())
    self._messages[tuple(ids)] = messages
    return ids

  def __call__(self, prompts: list[list[int]], seed: int, keys=None):
    del seed, keys  # the responder keeps its own sampling keys
    replies = self._responder.respond(
        [self._messages[tuple(ids)] for ids in prompts]
    )
    self._messages.clear()
    return [([], [], reply) for reply in replies]
