"""The multi-turn rollout engine: every episode of an iteration to its end.

Two ways to sample, one set of episode rules (`run_episodes`):

* Slots (`TurnServer`, `config.sampling.engine = "slots"`): every episode
  is an independent request to the slot engine (`spade.sampling.slots`).
  An episode's next turn is queued as soon as its reply has been stepped
  (or its tool calls executed), while the other slots keep decoding; no
  episode waits for another's long reply.
* Lock-step (`TokenSampler`, `"lockstep"`): each turn makes one batched
  sampling call per group of live episodes and one batched sandbox call for
  their actions. With `overlap=True` the episodes are split into (at least)
  two groups and pipelined: while one group's actions are stepped in the
  sandbox (a worker thread; the sandbox is other processes, so the GIL is
  not held while waiting), another group is being sampled (XLA releases the
  GIL). `rows_per_call` caps a group's size, so one call's KV cache fits the
  accelerator.

Either way the sandbox calls run in a worker thread while sampling goes on.

On several processes each process steps only its own slice of the episodes in
its own sandbox pool; results are all-gathered so every process holds the
same histories (see `StepExecutor`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import enum
import functools
import time
from typing import Any, Callable, Hashable, Protocol, Sequence, runtime_checkable

from spade.agent import actions as actions_lib
from spade.agent import episodes as episodes_lib
from spade.agent import prompts as prompts_lib
from spade.model import sharding


class ProgramHint(enum.Enum):
  """A hinted episode whose hint is the program's own `hint()` for the
  episode's seed (asked right after reset) rather than a written one."""

  ASK = "ask"


# `EpisodeSpec.hint` of such an episode.
ENV_HINT = ProgramHint.ASK


@dataclasses.dataclass(frozen=True)
class EpisodeSpec:
  """One episode to play: which environment, which seed, with or without hint."""

  env_index: int
  source: str
  seed: int
  hint: str | ProgramHint | None  # None: the unhinted arm
  sample: int = 0

  @property
  def hinted(self) -> bool:
    return self.hint is not None


class TokenSampler(Protocol):
  """What the engine needs from the model: a batched, seeded sampling call."""

  def __call__(
      self, prompts: list[list[int]], seed: int, keys: list[int]
  ) -> list[tuple[list[int], list[float], str]]:
    """Returns (token ids, logprobs, decoded text) for each prompt.

    `keys` name each prompt's episode: a sampler may keep an episode's KV
    cache between its turns (`spade.sampling.text.Session`), since the
    next prompt of an exact episode extends this one and its reply.
    """
    ...

  # Optional: `rows(n)`, the rows a call of n prompts runs (its batch, filler
  # rows included), for `RolloutStats.decode_row_steps`; n without it.


@runtime_checkable
class TurnServer(Protocol):
  """What the slots path needs: a queue of turns served as slots free up
  (`spade.selfplay.engine.TextServer` over `spade.sampling.slots.Server`)."""

  decode_row_steps: int  # decode slots x steps run, live or not
  tokens_generated: int

  def submit(self, key: int, prompt: list[int], seed: int, turn: int) -> None:
    """Queues episode `key`'s turn `turn`; its tokens depend only on
    (seed, key, turn) and the prompt, not on when or where it runs."""
    ...

  def step(self) -> list[tuple[Hashable, list[int], list[float], str]]:
    """Serves one round; (key, token ids, logprobs, text) of each turn that
    ended in it."""
    ...

  @property
  def busy(self) -> bool:
    """A turn is queued or being decoded."""
    ...


class StepExecutor(Protocol):
  """Runs environment calls for a list of episodes; the same on all hosts."""

  def reset(self, items: list[tuple[int, str, int, bool]]) -> list[dict]:
    """items: (episode id, source, seed, want env hint) ->
    [{"ok", "obs", "hint"} | error dict]."""
    ...

  def step(self, items: list[tuple[int, str]]) -> list[dict]:
    """items: (episode id, action) -> step result dicts (see SandboxPool)."""
    ...

  def call(self, items: list[tuple[int, str, list]]) -> list[dict]:
    """items: (episode id, method, args) -> {"ok", "value"} | error dict;
    the reference's `execute_tool(name, arguments)` goes through here."""
    ...

  def close(self, episode_ids: list[int]) -> None:
    ...


def _failure(res: dict) -> dict:
  """An environment call's error as a reset result: reason and message."""
  return {
      "ok": False,
      "reason": res.get("reason", "exception"),
      "message": str(res.get("message"))[:500],
  }


class PoolExecutor:
  """`StepExecutor` over a local `SandboxPool`, sliced across processes.

  Episode `i` is executed by process `i % process_count`; every call
  all-gathers the results so each process sees all of them, in order.
  """

  def __init__(
      self,
      pool: Any,
      *,
      process_index: int = 0,
      process_count: int = 1,
      allgather: Callable[[list], list[list]] | None = None,
  ):
    self._pool = pool
    self._me = process_index
    self._n = process_count
    self._allgather = allgather
    self._handles: dict[int, int] = {}

  def _mine(self, items):
    return [
        it for it in items if sharding.process_of(it[0], self._n) == self._me
    ]

  def _gather(self, items, local_results):
    if self._n == 1:
      return local_results
    mine = {it[0]: r for it, r in zip(self._mine(items), local_results)}
    gathered = {}
    for part in self._allgather(list(mine.items())):
      gathered.update({int(k): v for k, v in part})
    return [gathered[it[0]] for it in items]

  def reset(self, items):
    mine = self._mine(items)
    opened = self._pool.open_many(
        [
            {
                "source": source,
                "seed": seed,
                "calls": ["get_tools"] + (["hint"] if want_hint else []),
            }
            for _, source, seed, want_hint in mine
        ]
    )
    results = []
    for (eid, _, _, want_hint), res in zip(mine, opened):
      if not res.get("ok"):
        # A broken environment ends its episode with a recorded reason; it
        # must not stop the other episodes.
        results.append(_failure(res))
        continue
      self._handles[eid] = res["handle"]
      calls = res["calls"]
      hint = None
      if want_hint:
        if not calls.get("hint", {}).get("ok"):
          results.append(_failure(calls.get("hint", {})))
          continue
        hint = str(calls["hint"]["value"])
      # The agent cannot call tools it was never shown; the reference passes
      # them through the chat template, we append them as text (the same
      # form the seed_heldout eval suite uses). A game has no get_tools().
      tools = calls.get("get_tools", {})
      tools = tools.get("value") if tools.get("ok") else None
      results.append(
          {
              "ok": True,
              "obs": res["obs"] + prompts_lib.tools_suffix(tools),
              "hint": hint,
              "tools": bool(tools),
          }
      )
    return self._gather(items, results)

  def step(self, items):
    mine = [(eid, a) for eid, a in self._mine(items) if eid in self._handles]
    results = self._pool.step_many([(self._handles[e], a) for e, a in mine])
    by_id = dict(zip([e for e, _ in mine], results))
    local = [
        by_id.get(
            eid, {"ok": False, "reason": "no_env", "message": "not created"}
        )
        for eid, _ in self._mine(items)
    ]
    return self._gather(items, local)

  def call(self, items):
    mine = [it for it in self._mine(items) if it[0] in self._handles]
    batch = [(self._handles[e], m, list(a)) for e, m, a in mine]
    if hasattr(self._pool, "call_many"):
      results = self._pool.call_many(batch)
    else:
      results = []
      for handle, method, args in batch:
        try:
          results.append(
              {"ok": True, "value": self._pool.call(handle, method, *args)}
          )
        except Exception as e:  # pylint: disable=broad-except
          results.append(
              {
                  "ok": False,
                  "reason": getattr(e, "reason", "exception"),
                  "message": str(e)[:2000],
              }
          )
    by_id = dict(zip([it[0] for it in mine], results))
    local = [
        by_id.get(
            it[0], {"ok": False, "reason": "no_env", "message": "not created"}
        )
        for it in self._mine(items)
    ]
    return self._gather(items, local)

  def close(self, episode_ids):
    for eid in episode_ids:
      handle = self._handles.pop(eid, None)
      if handle is not None:
        try:
          self._pool.close_env(handle)
        except Exception:  # pylint: disable=broad-except
          pass  # the pool recycles a sandbox whose env will not close


@dataclasses.dataclass
class RolloutStats:
  """Seconds spent, for the iteration benchmark and the metrics."""

  sampling_s: float = 0.0
  sandbox_s: float = 0.0
  sandbox_hidden_s: float = 0.0
  tokens_sampled: int = 0
  tool_calls: int = 0
  # Replies to a tool-use environment that opened a `<tool_call>` the parser
  # could not read (and gave no `<answer>`).
  malformed_tool_calls: int = 0
  # Decode row-steps the sampling ran (slots x steps, or per lock-step call
  # its rows x the steps its longest reply took) and the tokens it made.
  decode_row_steps: int = 0
  tokens_generated: int = 0
  # Unhinted plays played again after their environment failed, and those
  # whose environment failed in the end (`retry_failed`).
  retried_plays: int = 0
  dropped_plays: int = 0

  @property
  def padding_ratio(self) -> float:
    """Decode row-steps per generated token (1.0: no padding)."""
    return self.decode_row_steps / max(self.tokens_generated, 1)

  def plus(self, other: "RolloutStats") -> "RolloutStats":
    """Both rollouts' figures summed (a retry round after the first)."""
    return RolloutStats(
        **{
            f.name: getattr(self, f.name) + getattr(other, f.name)
            for f in dataclasses.fields(self)
        }
    )


# What the reference appends to the observation after a malformed tool call
# (orchestrator._play_tool_game_async, SPADE_MASK_MALFORMED_TOOLCALL=1).
MALFORMED_TOOL_CALL_NOTE = (
    "\n\n[FORMAT] Your previous <tool_call> could not be parsed. Emit"
    ' exactly: <tool_call>{"name": "<tool_name>", "arguments":'
    " {<args>}}</tool_call>"
)


def malformed_tool_call(text: str, has_tools: bool) -> bool:
  """A reply to a tool-use environment that opens a `<tool_call>` but holds
  no call the parser reads and no `<answer>` (the reference's test)."""
  from spade.environments import tool_calls  # pylint: disable=g-import-not-at-top

  return (
      has_tools
      and "<tool_call>" in text
      and tool_calls.parse_answer(text) is None
      and not tool_calls.parse_tool_calls(text)
  )


# A step() that raised is the reference's outcome for the agent (reward -1,
# episode over), not an environment failure: the program is judged by it.
_STEP_RAISED = ("exception",)


@dataclasses.dataclass
class _Live:
  """An episode while it is played (frozen into `episodes.Episode` after)."""

  spec: EpisodeSpec
  first_observation: str = ""
  hint: str | None = None
  tools: bool = False
  turns: list[episodes_lib.Turn] = dataclasses.field(default_factory=list)
  done: bool = False
  terminated: bool = False
  truncated: bool = False
  env_failed: bool = False
  error: str | None = None
  failure: str | None = None
  # The running token sequence (see `episodes.Episode.tokens`) while the
  # episode is exact; `end` is its length after the last reply.
  exact: bool = False
  seq: list[int] = dataclasses.field(default_factory=list)
  seq_mask: list[bool] = dataclasses.field(default_factory=list)
  seq_lp: list[float] = dataclasses.field(default_factory=list)
  prompt_len: int = 0
  end: int = 0

  def fail(self, res: dict) -> None:
    self.done, self.env_failed = True, True
    failure = _failure(res)
    self.failure = failure["reason"]
    self.error = f"{failure['reason']}: {failure['message']}"

  def freeze(self) -> episodes_lib.Episode:
    return episodes_lib.Episode(
        env_index=self.spec.env_index,
        sample=self.spec.sample,
        hinted=self.spec.hinted,
        seed=self.spec.seed,
        hint=self.hint,
        first_observation=self.first_observation,
        turns=tuple(self.turns),
        terminated=self.terminated,
        truncated=self.truncated,
        env_failed=self.env_failed,
        error=self.error,
        failure=self.failure,
        tokens=tuple(self.seq[: self.end]),
        token_mask=tuple(self.seq_mask[: self.end]),
        token_logprobs=tuple(self.seq_lp[: self.end]),
        prompt_len=self.prompt_len,
        exact=self.exact,
    )


# Failure reasons of an environment call that ran past its budget: the
# reference's load, reset and step timeouts (`ENV_STEP_TIMEOUT`,
# core/orchestrator.py), after which it never plays the game again.
HANG_REASONS = frozenset({"call_timeout", "timeout"})
# `Episode.failure` of a tool call (`execute_tool`) past its budget: not a
# hang to the reference, which plays the play again.
TOOL_TIMEOUT = "tool_call_timeout"


def hung(ep: episodes_lib.Episode) -> bool:
  """The episode ended because an environment call ran past its budget."""
  return ep.env_failed and ep.failure in HANG_REASONS


def retryable(ep: episodes_lib.Episode) -> bool:
  """An unhinted play whose environment failed for a reason other than a
  hang: the reference plays such a play again (`play_games_async`); a hang
  it never plays again, and it plays hinted plays once."""
  return ep.env_failed and not ep.hinted and not hung(ep)


def retry_failed(
    specs: Sequence[EpisodeSpec],
    episodes: Sequence[episodes_lib.Episode],
    stats: RolloutStats,
    play_again: Callable[
        [list[EpisodeSpec], int],
        tuple[list[episodes_lib.Episode], RolloutStats],
    ],
    retries: int,
) -> tuple[list[episodes_lib.Episode], RolloutStats]:
  """Plays each `retryable` episode again, up to `retries` times.

  The reference's `play_games_async` (`max_attempts=2`): a failed play is
  played once more and, failing again, dropped (its group is one play
  short); a play that hung is not played again. `play_again(specs,
  attempt)` plays the same specs (same environment, seed and sample
  index), sampling afresh; its episode replaces the failed one. The
  returned stats count the plays retried and, after the last attempt,
  the unhinted plays still failed (`agent/retried_plays`,
  `agent/dropped_plays`).
  """
  episodes = list(episodes)
  for attempt in range(retries):
    again = [i for i, ep in enumerate(episodes) if retryable(ep)]
    if not again:
      break
    replayed, more = play_again([specs[i] for i in again], attempt)
    for i, ep in zip(again, replayed):
      episodes[i] = ep
    stats = stats.plus(more)
    stats.retried_plays += len(again)
  stats.dropped_plays = sum(ep.env_failed and not ep.hinted for ep in episodes)
  return episodes, stats


def unhinted_plays(
    num_valid: int, plays_per_iteration: int, episodes_per_env: int
) -> int:
  """Unhinted plays of each valid environment this iteration.

  The reference plays `ceil(global_batch_size / #games)` per game
  (`orchestrator.collect_trajectories`: 192 / 24 = 8), so a pool with fewer
  valid games plays each more; `plays_per_iteration = 0` plays
  `episodes_per_env` each (`config.agent`).
  """
  if plays_per_iteration <= 0 or num_valid <= 0:
    return episodes_per_env
  return -(-plays_per_iteration // num_valid)


def num_groups(episodes: int, rows_per_call: int, overlap: bool) -> int:
  """How many groups (one sampler call each per turn) `run_episodes` plays
  `episodes` in: two with `overlap` (one samples while the other's sandbox
  calls run), more when a group would hold over `rows_per_call` (> 0)."""
  k = 2 if overlap else 1
  if rows_per_call > 0:
    k = max(k, -(-episodes // rows_per_call))
  return k


def group_rows(episodes: int, rows_per_call: int, overlap: bool) -> int:
  """The most episodes one of `run_episodes`' sampler calls holds."""
  return -(-episodes // num_groups(episodes, rows_per_call, overlap))


def run_episodes(
    specs: Sequence[EpisodeSpec],
    sampler: TokenSampler | TurnServer,
    executor: StepExecutor,
    render: Callable[[list[dict[str, str]]], list[int]],
    *,
    max_turns: int,
    max_context: int,
    seed: int,
    overlap: bool = True,
    progress: Callable[[str], None] | None = None,
    extend: Callable[[list, str, list], list[int] | None] | None = None,
    stop_ids: Sequence[int] = (),
    rows_per_call: int = 0,
    prompt_style: str = "reference",
    action_rule: str = "parse",
    unfinished_reply: str = "end",
    hinted_unfinished_reply: str = "step",
    full_context: str = "end",
    mask_malformed_tool_calls: bool = False,
) -> tuple[list[episodes_lib.Episode], RolloutStats]:
  """Plays all episodes to the end (termination, truncation or `max_turns`).

  A turn is one agent reply, as the reference counts them. A reply to a
  tool-use environment that holds `<tool_call>`s (and no `<answer>`) runs
  every call through the environment's `execute_tool` and shows the results
  as `tool` messages, without a `step()` (so the environment's own turn
  limit is not spent on them); any other reply is the action for `step()`.
  A `step()` that raises ends the episode with reward -1 (the reference's
  outcome); a crash, timeout or lost sandbox marks the episode
  `env_failed`, and it is masked out of scoring and the update.

  The reference's episode rules (`spade/core/orchestrator.py`,
  `_play_game_async`) by default: `step()` receives `actions.step_action`
  of the reply (`\\boxed{...}` for a game); a reply that ends without a
  stop id (it hit its token limit) ends the episode, truncated, with no
  step; a later turn whose prompt no longer fits `max_context` ends the
  episode, truncated (the reference stops with under 64 tokens left). The
  first prompt is still shortened to fit (`prompts.truncate_messages`):
  validation refuses what no context can show.

  Args:
    specs: the episodes to play.
    sampler: the agent role's sampling: a `TurnServer` (the slot engine:
      each episode's turns are requests of their own) or a batched
      `TokenSampler` (lock-step groups of episodes).
    executor: runs reset/step/execute_tool in the sandboxes.
    render: chat messages -> prompt token ids (the tokenizer's chat format).
    max_turns: T, the limit on replies.
    max_context: the prompt token budget (`prompts.prompt_budget`): every
      prompt is cut by `prompts.truncate_messages` to it, and the sampler
      and trainer use the ids as they are.
    seed: base sampling seed. Lock-step: turn t of group g (of G) uses
      seed*1000 + G*t + g. Slots: turn t of episode i is drawn from
      (seed, i, t) alone.
    overlap: lock-step: pipeline the sandbox calls of one group of episodes
      behind the sampling of the others (at least two groups). Slots always
      overlap: a round's finished turns are stepped while the next round
      decodes.
    progress: optional callback for a log line per turn.
    extend: optional `extend(messages, reply, messages_after) -> ids`: the
      tokens the chat format puts after a reply to reach the next prompt
      (None when it cannot tell). Given it, an episode is played as one
      growing token sequence, each prompt the previous one plus the sampled
      reply plus these ids, so the whole episode trains as one row; an
      episode whose sequence outgrows `max_context` falls back to rendered,
      truncated prompts (and per-turn rows).
    stop_ids: the sampler's stop ids (a reply's closing stop id and the chat
      format's turn end are one token, not two).
    rows_per_call: lock-step: the most episodes one sampler call holds (0:
      no limit); more episodes are split into more groups (`num_groups`),
      each sampled in its own call, so a call's KV cache stays within the
      accelerator's memory (`python -m spade.compile` checks it).
    prompt_style: `config.agent.prompt_style`.
    action_rule: `config.agent.action`: "parse" (the reference) or "raw".
    unfinished_reply: `config.agent.unfinished_reply`: "end" (the
      reference: a reply whose last token is not in `stop_ids` ends the
      episode without a step) or "step" (ours). With no `stop_ids`
      (a sampler that cannot say) every reply counts as finished.
    hinted_unfinished_reply: `config.agent.hinted_unfinished_reply`, the
      same rule for the hinted arm: "step" (the reference's hinted plays,
      `_play_game_with_hint_async`, never look at EOS) or "end".
    full_context: `config.agent.full_context`: "end" (the reference) or
      "drop_oldest" (ours: `prompts.truncate_messages` drops the
      oldest exchanges and the episode goes on).
    mask_malformed_tool_calls: `config.agent.mask_malformed_tool_calls`:
      a reply to a tool-use environment that opens a `<tool_call>` the
      parser cannot read (`malformed_tool_call`) is still stepped, but its
      tokens carry no loss (`Turn.trained` False) and the observation ends
      with `MALFORMED_TOOL_CALL_NOTE` (the reference's
      SPADE_MASK_MALFORMED_TOOLCALL=1; off, it trains like any reply).

  Returns:
    The frozen episodes (same order as specs) and the time spent.
  """
  from spade.environments import tool_calls  # pylint: disable=g-import-not-at-top

  for name, value, allowed in (
      ("action", action_rule, actions_lib.RULES),
      ("unfinished_reply", unfinished_reply, ("end", "step")),
      ("hinted_unfinished_reply", hinted_unfinished_reply, ("end", "step")),
      ("full_context", full_context, ("end", "drop_oldest")),
  ):
    if value not in allowed:
      raise ValueError(f"config.agent.{name}={value!r} is not one of {allowed}")
  stops = frozenset(int(t) for t in stop_ids)

  live = [_Live(spec=s) for s in specs]
  stats = RolloutStats()
  t0 = time.perf_counter()

  def reset(ids):
    start = time.perf_counter()
    results = executor.reset(
        [
            (i, specs[i].source, specs[i].seed, specs[i].hint is ENV_HINT)
            for i in ids
        ]
    )
    return results, time.perf_counter() - start

  def apply_reset(ids, results):
    for i, res in zip(ids, results):
      ep = live[i]
      if res.get("ok"):
        ep.first_observation = res["obs"]
        ep.tools = bool(res.get("tools"))
        ep.hint = res.get("hint") if ep.spec.hint is ENV_HINT else ep.spec.hint
      else:
        ep.fail(res)

  def messages_of(ep, turns):
    return prompts_lib.episode_messages(
        ep.first_observation,
        ep.hint,
        turns,
        style=prompt_style,
        tools=ep.tools,
    )

  def prompt_for(ep):
    """The prompt ids of ep's next reply and whether they extend ep.seq;
    None when a later prompt no longer fits and `full_context` is "end", or
    when the environment's own words (its hint) cannot fit the prompt at
    all: that episode fails as the environment's fault, not the run."""
    try:
      return _prompt_for(ep)
    except ValueError as e:
      ep.done, ep.env_failed = True, True
      ep.failure, ep.error = "prompt", f"prompt: {e}"
      return None

  def _prompt_for(ep):
    messages = messages_of(ep, ep.turns)
    if extend is not None and not ep.turns:
      ids = prompts_lib.truncate_messages(messages, render, max_context)
      # Exact only if the task was not shortened to fit.
      ep.exact = len(ids) == len(render(messages))
      if ep.exact:
        ep.seq, ep.seq_mask = list(ids), [False] * len(ids)
        ep.seq_lp, ep.prompt_len = [0.0] * len(ids), len(ids)
      return ids, ep.exact
    if ep.exact and len(ep.seq) <= max_context:
      return list(ep.seq), True
    if full_context == "end" and ep.turns:
      ids = render(messages)
      if len(ids) > max_context:
        return None
      ep.exact = False
      return ids, False
    ep.exact = False
    return prompts_lib.truncate_messages(messages, render, max_context), False

  def sample(ids, turn, group):
    """Samples the next reply of each episode in ids that still fits."""
    prompts, kept = [], []
    for i in ids:
      prompt = prompt_for(live[i])
      if prompt is None:
        live[i].done, live[i].truncated = True, True
        continue
      prompts.append(prompt)
      kept.append(i)
    ids[:] = kept
    if not ids:
      return prompts, []
    start = time.perf_counter()
    outs = sampler(
        [p for p, _ in prompts], seed * 1000 + k * turn + group, keys=list(ids)
    )
    stats.sampling_s += time.perf_counter() - start
    made = [len(o[0]) for o in outs]
    stats.tokens_sampled += sum(made)
    # The call ran every row (filler rows too, `rows`) until its longest
    # reply ended (`slots.lockstep_row_steps`).
    rows = sampler.rows(len(outs)) if hasattr(sampler, "rows") else len(outs)
    stats.decode_row_steps += rows * max(made, default=0)
    stats.tokens_generated += sum(made)
    return prompts, outs

  def plan(i, text):
    """The reply's tool calls, or None when it is an action for step().

    The reference's rule, shared with validation's solution replay
    (`tool_calls.reply_actions`).
    """
    actions = tool_calls.reply_actions(text, live[i].tools)
    if actions[0][0] == "step":
      return None
    return [call for _, call in actions]

  def finished(tok):
    """The reply ended on a stop id (the reference: on EOS)."""
    return not stops or (bool(tok) and int(tok[-1]) in stops)

  def execute(ids, outs):
    start = time.perf_counter()

    def rule(i):
      hinted = live[i].spec.hinted
      return hinted_unfinished_reply if hinted else unfinished_reply

    plans = [
        "cut" if rule(i) == "end" and not finished(o[0]) else plan(i, o[2])
        for i, o in zip(ids, outs)
    ]
    stepped = [
        (i, actions_lib.step_action(o[2], live[i].tools, action_rule))
        for i, o, p in zip(ids, outs, plans)
        if p is None
    ]
    calls = [
        (i, "execute_tool", [c["name"], c["arguments"]])
        for i, p in zip(ids, plans)
        if p is not None and p != "cut"
        for c in p
    ]
    step_results = iter(executor.step(stepped) if stepped else [])
    call_results = iter(executor.call(calls) if calls else [])
    results = []
    for p in plans:
      if p == "cut":
        results.append(("cut", None))
      elif p is None:
        results.append(("step", next(step_results)))
      else:
        results.append(("tools", [next(call_results) for _ in p]))
    return results, time.perf_counter() - start

  def apply(ids, prompts, outs, results):
    for i, (prompt, in_seq), (tok, lp, text), (kind, res) in zip(
        ids, prompts, outs, results
    ):
      ep = live[i]
      before = ep.turns[:]
      if in_seq:
        # The prompt is ep.seq itself: keep only its length in the turn.
        turn = functools.partial(
            episodes_lib.Turn,
            (),
            tuple(tok),
            tuple(lp),
            text,
            context_len=len(prompt),
        )
        ep.seq += list(tok)
        ep.seq_mask += [True] * len(tok)
        ep.seq_lp += list(lp)
        ep.end = len(ep.seq)
      else:
        ep.exact = False
        turn = functools.partial(
            episodes_lib.Turn, tuple(prompt), tuple(tok), tuple(lp), text
        )
      if kind == "cut":
        # No EOS: the reply is kept (and trained on) but never stepped.
        ep.turns.append(turn(0.0, ""))
        ep.done, ep.truncated = True, True
        continue
      note = ""
      if kind == "step" and malformed_tool_call(text, ep.tools):
        stats.malformed_tool_calls += 1
        if mask_malformed_tool_calls:
          # Stepped (the environment may answer with guidance), not trained.
          turn = functools.partial(turn, trained=False)
          note = MALFORMED_TOOL_CALL_NOTE
          if in_seq:
            ep.seq_mask[len(ep.seq) - len(tok) :] = [False] * len(tok)
      if kind == "tools":
        outputs = []
        for r in res:
          if not r.get("ok"):
            ep.turns.append(turn(0.0, ""))
            ep.fail(r)
            if ep.failure in HANG_REASONS:
              # The reference's execute_tool timeout fails the play without
              # blacklisting its game, so the play is tried again.
              ep.failure = TOOL_TIMEOUT
            break
          value = r.get("value")
          output = value.get("output", "") if isinstance(value, dict) else value
          outputs.append(str(output))
        else:
          stats.tool_calls += len(outputs)
          ep.turns.append(turn(0.0, "", tuple(outputs)))
      elif not res.get("ok"):
        if res.get("reason") in _STEP_RAISED:
          ep.turns.append(turn(-1.0, ""))
          ep.done, ep.terminated = True, True
          ep.error = f"step raised: {str(res.get('message'))[:500]}"
        else:
          ep.turns.append(turn(0.0, ""))
          ep.fail(res)
        continue
      else:
        ep.terminated = bool(res["terminated"])
        ep.truncated = bool(res["truncated"])
        ep.done = ep.terminated or ep.truncated
        # The note is shown only when the episode goes on (the reference).
        obs = res["obs"] if ep.done else f"{res['obs']}{note}"
        ep.turns.append(turn(float(res["reward"]), obs))
      if not ep.done and len(ep.turns) >= max_turns:
        ep.done, ep.truncated = True, True
      if ep.exact and not ep.done:
        grow(ep, before, tok)

  def grow(ep, before, tok):
    """Appends what the chat format puts between the reply and the next
    prompt; an episode whose format cannot say stops being exact."""
    delta = extend(
        messages_of(ep, before),
        ep.turns[-1].action,
        messages_of(ep, ep.turns),
    )
    if delta is None:
      ep.exact = False
      return
    if tok and delta and tok[-1] in stop_ids and delta[0] == tok[-1]:
      delta = delta[1:]
    ep.seq += list(delta)
    ep.seq_mask += [False] * len(delta)
    ep.seq_lp += [0.0] * len(delta)

  def finish():
    wall = time.perf_counter() - t0
    # The main thread only samples or waits, so whatever of the sandbox time
    # does not add to the wall clock ran while sampling.
    stats.sandbox_hidden_s = min(
        stats.sandbox_s, max(0.0, stats.sampling_s + stats.sandbox_s - wall)
    )
    executor.close(list(range(len(live))))
    return [ep.freeze() for ep in live], stats

  def queue(ids):
    """Submits the next turn of each episode in ids that still fits."""
    for i in ids:
      ep = live[i]
      prompt = prompt_for(ep)
      if prompt is None:
        ep.done, ep.truncated = True, True
        continue
      prompts_of[i] = prompt
      sampler.submit(i, list(prompt[0]), seed, len(ep.turns))

  def rounds():
    """The slots path. Deterministic in its order, so every process (and a
    resumed run) makes the same calls: the turns that end in round r are
    stepped in the worker while round r + 1 decodes, and their next turns
    are queued after it."""
    rows0, made0 = sampler.decode_row_steps, sampler.tokens_generated
    everyone = list(range(len(live)))
    half = everyone[: (len(everyone) + 1) // 2]
    pending = []  # (future, apply(result)), in the order submitted
    last_line = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as worker:
      # The second half's environments start while the first half decodes.
      results, seconds = reset(half)
      stats.sandbox_s += seconds
      apply_reset(half, results)
      queue([i for i in half if not live[i].done])
      rest = everyone[len(half) :]
      if rest:

        def started(out, rest=rest):
          apply_reset(rest, out)
          queue([i for i in rest if not live[i].done])

        pending.append((worker.submit(reset, rest), started))
      while sampler.busy or pending:
        ended = []
        if sampler.busy:
          start = time.perf_counter()
          ended = sampler.step()
          stats.sampling_s += time.perf_counter() - start
        for future, then in pending:
          out, seconds = future.result()
          stats.sandbox_s += seconds
          then(out)
        pending = []
        if ended:
          ids = [int(key) for key, _, _, _ in ended]
          outs = [(tok, lp, text) for _, tok, lp, text in ended]
          stats.tokens_sampled += sum(len(o[0]) for o in outs)
          prompts = [prompts_of.pop(i) for i in ids]

          def stepped(out, ids=ids, prompts=prompts, outs=outs):
            apply(ids, prompts, outs, out)
            queue([i for i in ids if not live[i].done])

          pending.append((worker.submit(execute, ids, outs), stepped))
        now = time.perf_counter()
        if progress is not None and now - last_line >= 10.0:
          last_line = now
          progress(
              f"{sum(not e.done for e in live)} episodes still live,"
              f" {sum(len(e.turns) for e in live)} turns played"
          )
    stats.decode_row_steps += sampler.decode_row_steps - rows0
    stats.tokens_generated += sampler.tokens_generated - made0

  if isinstance(sampler, TurnServer):
    prompts_of: dict[int, tuple[list[int], bool]] = {}
    rounds()
    return finish()

  # Fixed groups, each advancing turn by turn on its own: group g's sandbox
  # calls run in the worker while the other groups sample.
  everyone = list(range(len(live)))
  k = num_groups(len(live), rows_per_call, overlap)
  groups = [everyone[g::k] for g in range(k)]
  pending: list[Any] = [None] * len(groups)
  with concurrent.futures.ThreadPoolExecutor(max_workers=1) as worker:
    # Every group's environments start in the worker, in order, so group
    # g + 1's resets run while group g samples its first turn.
    resets = [worker.submit(reset, members) for members in groups]
    for turn in range(max_turns + 1):
      for g, members in enumerate(groups):
        if turn == 0:
          results, seconds = resets[g].result()
          stats.sandbox_s += seconds
          apply_reset(members, results)
        if pending[g] is not None:
          ids, prompts, outs, future = pending[g]
          results, seconds = future.result()
          stats.sandbox_s += seconds
          apply(ids, prompts, outs, results)
          pending[g] = None
        ids = [i for i in members if not live[i].done]
        if ids and turn < max_turns:
          prompts, outs = sample(ids, turn, g)
          if ids:
            pending[g] = (ids, prompts, outs, worker.submit(execute, ids, outs))
      if progress is not None and turn < max_turns:
        progress(
            f"turn {turn + 1}/{max_turns}: "
            f"{sum(not e.done for e in live)} episodes still live"
        )
  return finish()
