"""The multi-turn rollout: every episode of an iteration to its end.

One loop (`run_episodes`) over one interface (`TurnServer`): every episode
is an independent request; its next turn is queued as soon as its reply has
been stepped (or its tool calls executed), while the other episodes keep
decoding, so no episode waits for another's long reply. The sandbox calls
run in a worker thread while sampling goes on (the sandbox is other
processes and XLA releases the GIL, so both make progress).

The policy's sampling is the slot engine
(`spade.sampling.slot_server.TextServer`). What answers a batch of prompts
at once instead (an evaluation `Responder`, a scripted sampler in a test)
is served through `BatchedTurns`, which answers every queued turn in one
call.

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
  """A batched, seeded sampling call (served through `BatchedTurns`)."""

  def __call__(
      self, prompts: list[list[int]], seed: int, keys: list[int]
  ) -> list[tuple[list[int], list[float], str]]:
    """Returns (token ids, logprobs, decoded text) for each prompt; `keys`
    name each prompt's episode."""
    ...


@runtime_checkable
class TurnServer(Protocol):
  """What the rollout drives: a queue of turns served as they can be
  (`spade.sampling.slot_server.TextServer`: as decode slots free up)."""

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


class BatchedTurns:
  """A `TurnServer` over a batched `TokenSampler`: each `step()` answers
  every queued turn in one call.

  Call n of a server gets seed `seed * 1000 + n` (the seed its first turn
  was submitted with). A call counts as its rows times its longest reply
  in `decode_row_steps`, as a lock-step batch decodes.
  """

  def __init__(self, sample: TokenSampler):
    self._sample = sample
    self._queue: list[tuple[int, list[int], int]] = []
    self._calls = 0
    self.decode_row_steps = 0
    self.tokens_generated = 0

  @property
  def busy(self) -> bool:
    return bool(self._queue)

  def submit(self, key: int, prompt: list[int], seed: int, turn: int) -> None:
    del turn  # the batch's seed stands for every turn in it
    self._queue.append((key, prompt, seed))

  def step(self) -> list[tuple[Hashable, list[int], list[float], str]]:
    queue, self._queue = self._queue, []
    keys = [key for key, _, _ in queue]
    seed = queue[0][2] * 1000 + self._calls
    outs = self._sample([p for _, p, _ in queue], seed, keys=keys)
    self._calls += 1
    made = [len(o[0]) for o in outs]
    self.decode_row_steps += len(outs) * max(made, default=0)
    self.tokens_generated += sum(made)
    return [(key, *out) for key, out in zip(keys, outs)]


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
  # Decode row-steps the sampling ran (slots x steps, or per `BatchedTurns`
  # call its rows x the steps its longest reply took) and the tokens it made.
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


class _Rollout:
  """The episodes of one `run_episodes` call and the rules that play them:
  resets, prompts, turning replies into environment calls, and recording
  what came back. `run_episodes` is the loop that drives it."""

  def __init__(
      self,
      specs: Sequence[EpisodeSpec],
      executor: StepExecutor,
      render: Callable[[list[dict[str, str]]], list[int]],
      *,
      max_turns: int,
      max_context: int,
      extend: Callable[[list, str, list], list[int] | None] | None,
      stop_ids: Sequence[int],
      prompt_style: str,
      action_rule: str,
      unfinished_reply: str,
      hinted_unfinished_reply: str,
      full_context: str,
      mask_malformed_tool_calls: bool,
  ):
    for name, value, allowed in (
        ("action", action_rule, actions_lib.RULES),
        ("unfinished_reply", unfinished_reply, ("end", "step")),
        ("hinted_unfinished_reply", hinted_unfinished_reply, ("end", "step")),
        ("full_context", full_context, ("end", "drop_oldest")),
    ):
      if value not in allowed:
        raise ValueError(
            f"config.agent.{name}={value!r} is not one of {allowed}"
        )
    self.specs = specs
    self.executor = executor
    self.render = render
    self.max_turns = max_turns
    self.max_context = max_context
    self.extend = extend
    self.stop_ids = stop_ids
    self.stops = frozenset(int(t) for t in stop_ids)
    self.prompt_style = prompt_style
    self.action_rule = action_rule
    self.unfinished_reply = unfinished_reply
    self.hinted_unfinished_reply = hinted_unfinished_reply
    self.full_context = full_context
    self.mask_malformed_tool_calls = mask_malformed_tool_calls
    self.live = [_Live(spec=s) for s in specs]
    self.stats = RolloutStats()
    # Each queued turn's prompt ids and whether they are its episode's seq.
    self.prompts: dict[int, tuple[list[int], bool]] = {}

  def reset(self, ids):
    """Starts the environments of episodes `ids`: (results, seconds)."""
    start = time.perf_counter()
    specs = self.specs
    results = self.executor.reset(
        [
            (i, specs[i].source, specs[i].seed, specs[i].hint is ENV_HINT)
            for i in ids
        ]
    )
    return results, time.perf_counter() - start

  def apply_reset(self, ids, results) -> None:
    for i, res in zip(ids, results):
      ep = self.live[i]
      if res.get("ok"):
        ep.first_observation = res["obs"]
        ep.tools = bool(res.get("tools"))
        ep.hint = res.get("hint") if ep.spec.hint is ENV_HINT else ep.spec.hint
      else:
        ep.fail(res)

  def _messages(self, ep, turns):
    return prompts_lib.episode_messages(
        ep.first_observation,
        ep.hint,
        turns,
        style=self.prompt_style,
        tools=ep.tools,
    )

  def _prompt_for(self, ep):
    """The prompt ids of ep's next reply and whether they extend ep.seq;
    None when a later prompt no longer fits and `full_context` is "end", or
    when the environment's own words (its hint) cannot fit the prompt at
    all: that episode fails as the environment's fault, not the run."""
    try:
      return self._prompt_ids(ep)
    except ValueError as e:
      ep.done, ep.env_failed = True, True
      ep.failure, ep.error = "prompt", f"prompt: {e}"
      return None

  def _prompt_ids(self, ep):
    render, max_context = self.render, self.max_context
    messages = self._messages(ep, ep.turns)
    if self.extend is not None and not ep.turns:
      ids = prompts_lib.truncate_messages(messages, render, max_context)
      # Exact only if the task was not shortened to fit.
      ep.exact = len(ids) == len(render(messages))
      if ep.exact:
        ep.seq, ep.seq_mask = list(ids), [False] * len(ids)
        ep.seq_lp, ep.prompt_len = [0.0] * len(ids), len(ids)
      return ids, ep.exact
    if ep.exact and len(ep.seq) <= max_context:
      return list(ep.seq), True
    if self.full_context == "end" and ep.turns:
      ids = render(messages)
      if len(ids) > max_context:
        return None
      ep.exact = False
      return ids, False
    ep.exact = False
    return prompts_lib.truncate_messages(messages, render, max_context), False

  def queue(self, server: TurnServer, seed: int, ids) -> None:
    """Submits the next turn of each episode in ids that is live and whose
    prompt still fits (one that does not ends, truncated)."""
    for i in ids:
      ep = self.live[i]
      if ep.done:
        continue
      prompt = self._prompt_for(ep)
      if prompt is None:
        ep.done, ep.truncated = True, True
        continue
      self.prompts[i] = prompt
      server.submit(i, list(prompt[0]), seed, len(ep.turns))

  def _plan(self, i, text):
    """The reply's tool calls, or None when it is an action for step().

    The reference's rule, shared with validation's solution replay
    (`tool_calls.reply_actions`).
    """
    from spade.environments import tool_calls  # pylint: disable=g-import-not-at-top

    actions = tool_calls.reply_actions(text, self.live[i].tools)
    if actions[0][0] == "step":
      return None
    return [call for _, call in actions]

  def _finished(self, tok):
    """The reply ended on a stop id (the reference: on EOS)."""
    return not self.stops or (bool(tok) and int(tok[-1]) in self.stops)

  def execute(self, ids, outs):
    """Runs the replies `outs` of episodes `ids` in their environments (a
    step, tool calls, or nothing for a reply cut without EOS): (results,
    seconds)."""
    start = time.perf_counter()

    def rule(i):
      if self.live[i].spec.hinted:
        return self.hinted_unfinished_reply
      return self.unfinished_reply

    plans = [
        "cut"
        if rule(i) == "end" and not self._finished(o[0])
        else self._plan(i, o[2])
        for i, o in zip(ids, outs)
    ]
    stepped = [
        (
            i,
            actions_lib.step_action(o[2], self.live[i].tools, self.action_rule),
        )
        for i, o, p in zip(ids, outs, plans)
        if p is None
    ]
    calls = [
        (i, "execute_tool", [c["name"], c["arguments"]])
        for i, p in zip(ids, plans)
        if p is not None and p != "cut"
        for c in p
    ]
    executor = self.executor
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

  def apply(self, ids, prompts, outs, results) -> None:
    """Records each reply and what its environment answered as a turn."""
    stats = self.stats
    for i, (prompt, in_seq), (tok, lp, text), (kind, res) in zip(
        ids, prompts, outs, results
    ):
      ep = self.live[i]
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
        if self.mask_malformed_tool_calls:
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
      if not ep.done and len(ep.turns) >= self.max_turns:
        ep.done, ep.truncated = True, True
      if ep.exact and not ep.done:
        self._grow(ep, before, tok)

  def _grow(self, ep, before, tok):
    """Appends what the chat format puts between the reply and the next
    prompt; an episode whose format cannot say stops being exact."""
    delta = self.extend(
        self._messages(ep, before),
        ep.turns[-1].action,
        self._messages(ep, ep.turns),
    )
    if delta is None:
      ep.exact = False
      return
    if tok and delta and tok[-1] in self.stop_ids and delta[0] == tok[-1]:
      delta = delta[1:]
    ep.seq += list(delta)
    ep.seq_mask += [False] * len(delta)
    ep.seq_lp += [0.0] * len(delta)

  def finish(self, wall: float):
    """Closes every environment; the frozen episodes and the stats."""
    stats = self.stats
    # The main thread only samples or waits, so whatever of the sandbox time
    # does not add to the wall clock ran while sampling.
    stats.sandbox_hidden_s = min(
        stats.sandbox_s, max(0.0, stats.sampling_s + stats.sandbox_s - wall)
    )
    self.executor.close(list(range(len(self.live))))
    return [ep.freeze() for ep in self.live], stats


def run_episodes(
    specs: Sequence[EpisodeSpec],
    sampler: TurnServer | TokenSampler,
    executor: StepExecutor,
    render: Callable[[list[dict[str, str]]], list[int]],
    *,
    max_turns: int,
    max_context: int,
    seed: int,
    progress: Callable[[str], None] | None = None,
    extend: Callable[[list, str, list], list[int] | None] | None = None,
    stop_ids: Sequence[int] = (),
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

  The loop, deterministic in its order so every process (and a resumed
  run) makes the same calls: the first half of the episodes is reset and
  queued while the second half's environments start in a worker thread;
  then each round, `sampler.step()` decodes while the worker steps the
  turns that ended in the round before, and their next turns are queued
  after it. No episode waits for another's long reply.

  Args:
    specs: the episodes to play.
    sampler: the agent role's sampling: a `TurnServer` (the slot engine,
      `spade.sampling.slot_server.TextServer`: each episode's turns are
      requests of their own), or a batched `TokenSampler` (an evaluation
      responder, a scripted sampler), served through `BatchedTurns`.
    executor: runs reset/step/execute_tool in the sandboxes.
    render: chat messages -> prompt token ids (the tokenizer's chat format).
    max_turns: T, the limit on replies.
    max_context: the prompt token budget (`prompts.prompt_budget`): every
      prompt is cut by `prompts.truncate_messages` to it, and the sampler
      and trainer use the ids as they are.
    seed: base sampling seed: turn t of episode i is drawn from (seed, i, t)
      alone (`TurnServer.submit`).
    progress: optional callback for a log line every ~10 s.
    extend: optional `extend(messages, reply, messages_after) -> ids`: the
      tokens the chat format puts after a reply to reach the next prompt
      (None when it cannot tell). Given it, an episode is played as one
      growing token sequence, each prompt the previous one plus the sampled
      reply plus these ids, so the whole episode trains as one row; an
      episode whose sequence outgrows `max_context` falls back to rendered,
      truncated prompts (and per-turn rows).
    stop_ids: the sampler's stop ids (a reply's closing stop id and the chat
      format's turn end are one token, not two).
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
  play = _Rollout(
      specs,
      executor,
      render,
      max_turns=max_turns,
      max_context=max_context,
      extend=extend,
      stop_ids=stop_ids,
      prompt_style=prompt_style,
      action_rule=action_rule,
      unfinished_reply=unfinished_reply,
      hinted_unfinished_reply=hinted_unfinished_reply,
      full_context=full_context,
      mask_malformed_tool_calls=mask_malformed_tool_calls,
  )
  server = sampler if isinstance(sampler, TurnServer) else BatchedTurns(sampler)
  stats, live = play.stats, play.live
  t0 = last_line = time.perf_counter()
  rows0, made0 = server.decode_row_steps, server.tokens_generated
  everyone = list(range(len(live)))
  half = everyone[: (len(everyone) + 1) // 2]
  rest = everyone[len(half) :]

  def started(ids, results):
    play.apply_reset(ids, results)
    play.queue(server, seed, ids)

  def stepped(ids, prompts, outs, results):
    play.apply(ids, prompts, outs, results)
    play.queue(server, seed, ids)

  pending = []  # (future, what to do with its result), in the order submitted
  with concurrent.futures.ThreadPoolExecutor(max_workers=1) as worker:
    results, seconds = play.reset(half)
    stats.sandbox_s += seconds
    started(half, results)
    if rest:
      # The second half's environments start while the first half decodes.
      pending.append(
          (worker.submit(play.reset, rest), functools.partial(started, rest))
      )
    while server.busy or pending:
      ended = []
      if server.busy:
        start = time.perf_counter()
        ended = server.step()
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
        prompts = [play.prompts.pop(i) for i in ids]
        pending.append(
            (
                worker.submit(play.execute, ids, outs),
                functools.partial(stepped, ids, prompts, outs),
            )
        )
      now = time.perf_counter()
      if progress is not None and now - last_line >= 10.0:
        last_line = now
        progress(
            f"{sum(not e.done for e in live)} episodes still live,"
            f" {sum(len(e.turns) for e in live)} turns played"
        )
  stats.decode_row_steps += server.decode_row_steps - rows0
  stats.tokens_generated += server.tokens_generated - made0
  return play.finish(time.perf_counter() - t0)
