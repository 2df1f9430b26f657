"""The seed environments kept out of training, played multi-turn in the sandbox.

The environments are the seed library's programs flagged `heldout=True`
(`spade.environments.library.seed_programs()`); training never samples them.
Episode i plays program i % P (P held-out programs) with seed
`config.eval.seed + i // P`, without a hint, for at most `config.eval.max_turns`
turns (0: `config.agent.max_turns`). All live episodes advance together: one
`respond` call and one `pool.step_many` call per turn. The prompt is the
agent's own (`spade.agent.prompts.history_messages`), so the agent is
evaluated in the format it is trained in; for tool-use environments the
tools' JSON schemas (`get_tools()`) are appended to the first observation,
since the protocol gives them to the agent out of band.

An episode's score is its total reward clipped to [0, 1] (the contract's
return); an environment that fails in the sandbox scores 0 and its reason is
logged.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from spade.agent import prompts as prompts_lib
from spade.eval import registry


@dataclasses.dataclass
class _Episode:
  """One held-out episode as it is played."""

  name: str
  source: str
  seed: int
  handle: int | None = None
  first_observation: str = ""
  turns: list[tuple[str, str]] = dataclasses.field(default_factory=list)
  total_reward: float = 0.0
  done: bool = False
  error: str = ""

  @property
  def item_id(self) -> str:
    """ "<program>/seed<seed>", e.g. "hangman/seed1234"."""
    return f"{self.name}/seed{self.seed}"


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


def _failure(error: Exception) -> str:
  return f"{getattr(error, 'reason', type(error).__name__)}: {error}"[:300]


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
      eval_config: `config.eval` (see `runner.eval_config`).
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

  def _start(self, ep: _Episode, pool: Any) -> None:
    """Creates and resets the environment; a failure ends the episode."""
    try:
      ep.handle = pool.create(ep.source)
      observation, _ = pool.reset(ep.handle, ep.seed)
      if "get_tools" in ep.source or "ToolUseBaseEnv" in ep.source:
        observation += prompts_lib.tools_suffix(
            pool.call(ep.handle, "get_tools")
        )
      ep.first_observation = observation
    except Exception as e:  # pylint: disable=broad-except
      # A broken environment scores 0 with its reason; the others go on.
      ep.done, ep.error = True, _failure(e)

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
          " (spade.sandbox.SandboxPool.from_config(config.sandbox))"
      )
    episodes = [_Episode(*spec) for spec in self.episodes(num_examples)]
    try:
      for ep in episodes:
        self._start(ep, pool)
      for _ in range(self.max_turns):
        live = [ep for ep in episodes if not ep.done]
        if not live:
          break
        replies = responder.respond(
            [
                prompts_lib.history_messages(
                    ep.first_observation, None, ep.turns
                )
                for ep in live
            ]
        )
        results = pool.step_many(
            [(ep.handle, reply) for ep, reply in zip(live, replies)]
        )
        for ep, reply, res in zip(live, replies, results):
          if not res.get("ok"):
            ep.done = True
            ep.error = f"{res.get('reason')}: {res.get('message')}"[:300]
            ep.turns.append((reply, ""))
            continue
          ep.turns.append((reply, res["obs"]))
          ep.total_reward += float(res["reward"])
          ep.done = bool(res["terminated"] or res["truncated"])
    finally:
      for ep in episodes:
        if ep.handle is not None:
          pool.close_env(ep.handle)
    results = []
    for ep in episodes:
      score = min(1.0, max(0.0, ep.total_reward))
      detail = f"return={ep.total_reward:.2f} turns={len(ep.turns)}" + (
          f" error={ep.error}" if ep.error else ""
      )
      last = ep.turns[-1][0] if ep.turns else ""
      result = registry.ItemResult(ep.item_id, score, last, detail, ep.name)
      log(result.log_line(self.name))
      results.append(result)
    return registry.SuiteResult(
        self.name,
        tuple(results),
        {"environments": sorted({ep.name for ep in episodes})},
    )
