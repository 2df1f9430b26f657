r"""The same multi-turn workload played lock-step and through the slot engine.

  python benchmarks/rollout.py [--workloads=replay,synthetic] [--slots=16]
      [--episodes=RUN/programs/iter_000001/episodes.jsonl,...] [--repeats=3]
      [--put_steps_from=6] [--in_place=1] [--min_window=64]

The tiny model (configs/tiny.py's, random weights, float32, CPU), sampled
at temperature 1 with no stop ids: every reply ends at its scripted length
(a per-request limit), so both ways generate exactly the same number of
tokens and only the decode row-steps and the time differ.

* Lock-step (the batched `Sampler`): the episodes are split into groups of at most
  `--lockstep_rows` (the rollout's two overlapped groups); each turn, one
  `Sampler` call per group holds its live episodes (padded to a power of
  two) and decodes until the group's longest reply ends. Each episode's KV
  cache is carried to its next turn (`Carry`, as `agent.carry_cache` does),
  and identical first prompts are prefilled once.
* Slots: one `spade.sampling.slot_engine.SlotEngine` of `--slots` decode
  slots (16, the default config's `sampling.slots`: below the 24 and 32 episodes in
  flight here, as a real rollout's slots are); an episode's next turn is
  queued the moment its reply ends (`generate` returns as soon as a row
  ends) and continues its slot's cache; a first prompt another slot holds
  is copied, not prefilled (`SlotEngine.share_prefixes`); each call runs on
  the smallest cache window that holds the live histories
  (`SlotEngine.windows`) and on the live slots gathered into the smallest row
  count that holds them (`--min_rows`, `SlotEngine.rows`).

Every request's PRNG key is derived before the clock starts, on both paths.

Workloads (reply lengths, in tokens):

* `replay`: with `--episodes`, each file (a run's
  `programs/iter_NNNNNN/episodes.jsonl`, `train.save_episodes`) is one
  iteration: its episodes, each environment's sharing one 128-token first
  prompt, reply i and observation i the UTF-8 byte lengths of turn i's
  action and observation (the tiny model's tokens are bytes; replies
  capped at 192, observations at 64), turns cut where the history would
  outgrow 1024 tokens. Without it (the default; no run's `episodes.jsonl`
  is in the repository), the lengths are SYNTHESISED from the 0.5B
  agent curve as README.md records it: 3 games x 4 episodes x 2 arms = 24
  episodes an iteration, two groups of 12, replies of up to 192 tokens;
  about a third end in a `\boxed{}` answer (here: uniform in [40, 191]),
  the rest are cut off at 192, or, on higher/lower's later turns, are bare
  numbers (2-6 tokens); higher/lower plays up to 4 turns (ending after
  each with probability 1/4), the other two games one. 3,600-5,400 new
  tokens an iteration were measured; this draws about 5,000. Four
  iterations, each its own rollout.
* `synthetic`: shaped like the reference's games recipe (long-tailed
  reasoning replies up to a cap, up to 25 turns): 32 episodes (8
  environments x 4, each environment's episodes sharing a first prompt),
  each ending after a geometric number of turns (mean 10, at most 25),
  replies lognormal (median 12, sigma 1.2) capped at 96 tokens, 8-token
  observations.

Both ways run the workload once to compile (not timed), then `--repeats`
timed passes, alternating which way goes first (the machine may be
shared); each way's figure is its fastest pass, and no timed pass may
compile (checked through jax.monitoring). Lock-step time counts only its
`Sampler` calls (its host bookkeeping between them is left out, in its
favour); slot time counts the whole `Server.run`. The last slot pass
prints where its time went (prefill-insert against generate calls, and
the windows and row counts the generate calls ran on). A line every ~10 s
shows progress; the last line is key=value, `replay_source` saying where
the replay's lengths came from (`synthesised` or `episodes`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top
import numpy as np

from configs import tiny
from spade import console
from spade.model import transformer
from spade.sampling import sampler as sampler_lib
from spade.sampling import shapes
from spade.sampling import slot_engine
from spade.sampling import slot_server

PAD = 256


@dataclasses.dataclass(frozen=True)
class Episode:
  """A scripted episode: first prompt, then per turn a reply length and the
  observation that follows it."""

  key: int
  prompt: tuple[int, ...]
  replies: tuple[int, ...]
  observations: tuple[tuple[int, ...], ...]


def replay_workload(seed: int) -> tuple[list[list[Episode]], int]:
  """Iterations of episodes (see the module docstring) and the reply cap."""
  rng = np.random.default_rng(seed)
  cap, iterations = 192, []
  for it in range(4):
    episodes = []
    for game in range(3):
      prompt = tuple(rng.integers(0, 256, 128).tolist())
      for _ in range(8):  # 4 episodes x 2 arms
        replies = []
        while True:
          later = game == 0 and replies
          u = rng.random()
          if later and u < 0.5:
            replies.append(int(rng.integers(2, 7)))  # a bare number
          elif u < (0.5 + 1 / 6 if later else 1 / 3):
            replies.append(int(rng.integers(40, cap)))  # a boxed answer
          else:
            replies.append(cap)  # cut off in its reasoning
          if game != 0 or len(replies) == 4 or rng.random() < 0.25:
            break
        obs = tuple(tuple(rng.integers(0, 256, 24).tolist()) for _ in replies)
        episodes.append(
            Episode(1000 * it + len(episodes), prompt, tuple(replies), obs)
        )
    iterations.append(episodes)
  return iterations, cap


def episodes_workload(
    paths: list[str], max_len: int = 1024, cap: int = 192, obs_cap: int = 64
) -> tuple[list[list[Episode]], int]:
  """Iterations replayed from `episodes.jsonl` files, one a file (see the
  module docstring), and the reply cap."""
  rng = np.random.default_rng(0)
  iterations = []
  for it, path in enumerate(paths):
    with open(path) as f:
      rows = [json.loads(line) for line in f if line.strip()]
    prompts, episodes = {}, []
    for row in rows:
      env = row["env_index"]
      if env not in prompts:
        prompts[env] = tuple(rng.integers(0, 256, 128).tolist())
      replies, obs, used = [], [], len(prompts[env])
      for t in row["turns"]:
        r = min(cap, max(1, len(t["action"].encode())))
        o = min(obs_cap, len(t["observation"].encode()))
        if used + r > max_len:
          break
        replies.append(r)
        obs.append(tuple(rng.integers(0, 256, o).tolist()))
        used += r + o
      if replies:
        key = 1000 * it + len(episodes)
        episodes.append(Episode(key, prompts[env], tuple(replies), tuple(obs)))
    if not episodes:
      raise ValueError(f"{path}: no episode with a turn to replay")
    iterations.append(episodes)
  return iterations, cap


def synthetic_workload(
    seed: int, max_len: int = 1024
) -> tuple[list[list[Episode]], int]:
  """One iteration of long-tailed episodes (see the module docstring)."""
  rng = np.random.default_rng(seed)
  cap, episodes = 96, []
  for _ in range(8):
    prompt = tuple(rng.integers(0, 256, 48).tolist())
    for _ in range(4):
      turns = min(25, int(rng.geometric(0.1)))
      drawn = np.minimum(
          np.ceil(rng.lognormal(np.log(12), 1.2, turns)), cap
      ).astype(int)
      # The context holds the whole history: an episode that would outgrow
      # the model's 1024 tokens ends there (truncated, as the loop does).
      replies, used = [], len(prompt)
      for r in drawn.tolist():
        if used + r > max_len:
          break
        replies.append(r)
        used += r + 8
      obs = tuple(tuple(rng.integers(0, 256, 8).tolist()) for _ in replies)
      episodes.append(Episode(len(episodes), prompt, tuple(replies), obs))
  return [episodes], cap


class Progress:
  """Prints a line at most every `every` seconds."""

  def __init__(self, label: str, every: float = 10.0):
    self.label, self.every = label, every
    self.start = self.last = time.perf_counter()

  def __call__(self, message: str) -> None:
    now = time.perf_counter()
    if now - self.last >= self.every:
      self.last = now
      print(f"  [{self.label} {now - self.start:.0f}s] {message}",
            file=sys.stderr, flush=True)  # fmt: skip


def _key(seed: int, episode: int, turn: int):
  return jax.random.fold_in(
      jax.random.fold_in(jax.random.key(seed), episode), turn
  )


def play_lockstep(sampler, params, iterations, cap, group_rows, progress):
  """(seconds, decode row-steps, tokens generated) playing lock-step."""
  seconds, row_steps, tokens = 0.0, 0, 0
  turns = max(len(e.replies) for it in iterations for e in it)
  groups = max(max(2, -(-len(it) // group_rows)) for it in iterations)
  keys = {(g, t): _key(7, g, t) for g in range(groups) for t in range(turns)}
  for episodes in iterations:
    n_groups = max(2, -(-len(episodes) // group_rows))
    groups = [episodes[g::n_groups] for g in range(n_groups)]
    history = {e.key: list(e.prompt) for e in episodes}
    kept = {}  # group -> (output, {episode key: its row})
    for turn in range(max(len(e.replies) for e in episodes)):
      for g, group in enumerate(groups):
        live = [e for e in group if turn < len(e.replies)]
        if not live:
          continue
        rows = shapes.bucket(len(live))
        todo = live + [live[-1]] * (rows - len(live))
        limits = np.array(
            [e.replies[turn] for e in live] + [0] * (rows - len(live)),
            np.int32,
        )
        carry, prompts = None, [history[e.key] for e in todo]
        if g in kept:
          out, where = kept[g]
          from_rows = np.array([where[e.key] for e in todo], np.int32)
          held = [len(out.slots[r]) for r in from_rows]
          width = shapes.bucket(max(held))
          table = np.full((rows, width), -1, np.int32)
          for i, r in enumerate(from_rows):
            table[i, : held[i]] = out.slots[r]
          carry = sampler_lib.Carry(out.cache, from_rows, table)
          prompts = [history[e.key][h:] for e, h in zip(todo, held)]
        t0 = time.perf_counter()
        out = sampler(
            params, prompts, max_new_tokens=cap, rng=keys[g, turn],
            temperature=1.0, row_max_new_tokens=limits, carry=carry,
            keep_cache=True,
        )  # fmt: skip
        seconds += time.perf_counter() - t0
        row_steps += slot_server.lockstep_row_steps(out)
        tokens += int(out.lengths.sum())
        kept[g] = (out, {e.key: i for i, e in enumerate(live)})
        for i, e in enumerate(live):
          assert out.lengths[i] == e.replies[turn]
          history[e.key] += out.tokens[i, : out.lengths[i]].tolist()
          history[e.key] += list(e.observations[turn])
        progress(f"turn {turn + 1}, {tokens} tokens, {row_steps} row-steps")
  return seconds, row_steps, tokens


def play_slots(engine, params, iterations, progress, report=False):
  """(seconds, decode row-steps, tokens generated, turns that continued
  their slot's cache) playing through the slot engine; with `report`, a
  line per iteration on where the time went."""
  seconds, row_steps, tokens, carried = 0.0, 0, 0, 0
  for episodes in iterations:
    server = slot_server.SlotServer(engine, params)
    by_key = {e.key: e for e in episodes}
    turn = {e.key: 0 for e in episodes}
    keys = {(e.key, t): _key(9, e.key, t)
            for e in episodes for t in range(len(e.replies))}  # fmt: skip

    def request(e, prompt, keys=keys, turn=turn):
      t = turn[e.key]
      return slot_server.Request(e.key, prompt, e.replies[t], keys[e.key, t])

    def next_turn(res, server=server, by_key=by_key, turn=turn):
      e = by_key[res.request.key]
      assert len(res.tokens) == e.replies[turn[e.key]]
      obs = e.observations[turn[e.key]]
      turn[e.key] += 1
      if turn[e.key] < len(e.replies):
        prompt = list(res.request.prompt) + res.tokens.tolist() + list(obs)
        server.submit(request(e, prompt))
      progress(
          f"{server.tokens_generated} tokens, {server.decode_row_steps}"
          f" row-steps, {server.live} live, {len(server.queue)} queued"
      )

    t0 = time.perf_counter()
    server.run([request(e, list(e.prompt)) for e in episodes], next_turn)
    seconds += time.perf_counter() - t0
    row_steps += server.decode_row_steps
    tokens += server.tokens_generated
    carried += server.requests_carried
    if report:
      print(
          f"  slots: prefill-insert {server.prefill_seconds:.2f}s of"
          f" {server.seconds:.2f}s ({server.prefill_calls} calls), generate"
          f" {server.seconds - server.prefill_seconds:.2f}s"
          f" ({server.generate_calls} calls, {server.prefix_calls} in"
          f" place; calls per window"
          f" {dict(sorted(server.windows.items()))}, per row count"
          f" {dict(sorted(server.rows.items()))});"
          f" {server.prefill_columns}"
          f" prefill columns, {server.requests_shared} requests shared"
          f" {server.tokens_shared} prefix tokens",
          file=sys.stderr,
          flush=True,
      )
  return seconds, row_steps, tokens, carried


def main() -> None:
  console.no_tpu_probe()  # before JAX starts a backend: no libtpu page
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workloads", default="replay,synthetic")
  parser.add_argument("--slots", type=int, default=16)
  parser.add_argument("--lockstep_rows", type=int, default=16)
  parser.add_argument("--decode_steps", type=int, default=32)
  parser.add_argument("--prefill_chunk", type=int, default=16)
  parser.add_argument("--prefill_rows", type=int, default=1)
  parser.add_argument(
      "--min_rows", type=int, default=4,
      help="generate runs on the live slots gathered into the smallest of"
      " min_rows, 3/2 x, 2 x, 3 x, ... (below slots), slots rows that holds"
      " them (0: always every slot; `SlotEngine.min_rows`)",
  )  # fmt: skip
  parser.add_argument(
      "--share_prefixes", type=int, default=1,
      help="1: the engine copies shared first prompts (the default); 0: off",
  )  # fmt: skip
  parser.add_argument(
      "--put_steps_from", type=int,
      default=slot_engine.SlotEngine.put_steps_from,
      help="a gathered call of at least this many rows puts back only its"
      " steps' slots, fewer their rows whole (SlotEngine.put_steps_from)",
  )  # fmt: skip
  parser.add_argument(
      "--in_place", type=int, default=-1,
      help="1: a gathered call on the whole cache runs on its live slots in"
      " place, moved to the front first (SlotEngine.in_place); 0: on taken"
      " rows; -1: the engine's default (on TPU only)",
  )  # fmt: skip
  parser.add_argument(
      "--min_window", type=int, default=slot_engine.SlotEngine.min_window,
      help="the smallest cache window a call attends over (0: always the"
      " whole cache, as on a model with sliding-window layers such as"
      " Gemma 3's; SlotEngine.min_window)",
  )  # fmt: skip
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument(
      "--episodes", default="",
      help="comma-separated episodes.jsonl files to replay (one iteration"
      " each) instead of the synthesised replay lengths",
  )  # fmt: skip
  args = parser.parse_args()
  compiles = []
  jax.monitoring.register_event_duration_secs_listener(
      lambda event, secs, **kw: compiles.append(event)
      if event == "/jax/core/compile/backend_compile_duration"
      else None
  )
  cfg = tiny.get_config().model
  params = transformer.init_params(cfg, jax.random.key(0))
  fns = transformer.sampling_fns(cfg, transformer.Role.AGENT)
  sampler = sampler_lib.Sampler(*fns, pad_id=PAD)
  engine = slot_engine.SlotEngine(
      fns.tokens_to_logits, fns.init_cache, fns.prepare_params,
      pad_id=PAD, slots=args.slots, cache_length=cfg.max_len,
      prefill_chunk=args.prefill_chunk, prefill_rows=args.prefill_rows,
      decode_steps=args.decode_steps, temperature=1.0,
      share_prefixes=bool(args.share_prefixes), min_rows=args.min_rows,
      put_steps_from=args.put_steps_from,
      in_place=None if args.in_place < 0 else bool(args.in_place),
      min_window=args.min_window,
  )  # fmt: skip
  make = dict(replay=replay_workload, synthetic=synthetic_workload)
  source = "synthesised"
  if args.episodes:
    paths = args.episodes.split(",")
    make["replay"] = lambda seed: episodes_workload(paths)
    source = "episodes"
    print(f"replay: lengths from {', '.join(paths)}", file=sys.stderr)
  figures = [f"replay_source={source}"]
  for name in args.workloads.split(","):
    iterations, cap = make[name](args.seed)
    n = sum(len(it) for it in iterations)
    turns = sum(len(e.replies) for it in iterations for e in it)

    print(f"{name}: {n} episodes, {turns} turns, replies up to {cap} tokens",
          file=sys.stderr, flush=True)  # fmt: skip
    def lockstep(tag, iterations=iterations, cap=cap, name=name):
      return play_lockstep(
          sampler, params, iterations, cap, args.lockstep_rows,
          Progress(f"{name} lock-step {tag}"),
      )  # fmt: skip

    def slots(tag, report=False, iterations=iterations, name=name):
      return play_slots(
          engine, params, iterations, Progress(f"{name} slots {tag}"), report
      )

    lockstep("compile")
    slots("compile")
    compiled = len(compiles)
    locks, slot_runs = [], []
    for r in range(args.repeats):
      last = r == args.repeats - 1
      if r % 2:
        slot_runs.append(slots("timed", last))
        locks.append(lockstep("timed"))
      else:
        locks.append(lockstep("timed"))
        slot_runs.append(slots("timed", last))
    assert len(compiles) == compiled, "a timed pass compiled"
    lock = min(locks, key=lambda x: x[0])
    slot = min(slot_runs, key=lambda x: x[0])
    assert lock[2] == slot[2], (lock[2], slot[2])
    print(
        f"{name}: lock-step {lock[0]:.2f}s (passes"
        f" {', '.join(f'{x[0]:.2f}' for x in locks)}) {lock[1]} row-steps;"
        f" slots {slot[0]:.2f}s (passes"
        f" {', '.join(f'{x[0]:.2f}' for x in slot_runs)}) {slot[1]}"
        f" row-steps; {lock[2]} tokens;"
        f" {slot[3]} turns continued their slot's cache",
        file=sys.stderr,
        flush=True,
    )
    figures += [
        f"{name}_lockstep_padding_ratio={lock[1] / lock[2]:.3f}",
        f"{name}_slots_padding_ratio={slot[1] / slot[2]:.3f}",
        f"{name}_lockstep_s={lock[0]:.2f}",
        f"{name}_slots_s={slot[0]:.2f}",
        f"{name}_speedup={lock[0] / slot[0]:.2f}",
    ]
  # One compile per window used, at most one per window.
  assert engine.traces["generate"] <= len(engine.windows) * len(
      engine.rows
  ), engine.traces
  print(" ".join(figures))


if __name__ == "__main__":
  main()
