"""Plays an environment program in the terminal.

  python -m spade.environments.play FILE [--seed N] [--show-hint]
      [--backend gvisor|bwrap|none]
  python -m spade.environments.play NAME --workdir RUN [--show-hint]

With `--workdir`, the program is looked up in the run's memory
(RUN/memory.json) by archive id (`env-000012`), class name, or the contents
of FILE, and the hint shown is the one the run wrote for it (the hint its
hinted episodes saw); without it, the program's own `hint()`.

Prints the observation, reads one action a line from stdin (so a game can
be scripted: `printf '\\\\boxed{up}\\n' | python -m ...`), prints the reward
and the next observation until the episode ends or stdin does. Type :hint
for the hint, :tools for a tool-use program's tools, :quit to stop. In a
tool-use program a line's tool calls run through `execute_tool` without
spending a turn, as in the reference's play; a line with <answer> or no call
is a step. The program runs in the sandbox (backend gvisor by default).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from spade.environments import tool_calls


def _parse(argv: list[str] | None) -> argparse.Namespace:
  p = argparse.ArgumentParser(
      prog="python -m spade.environments.play",
      description="Play an environment program in the terminal.",
  )
  p.add_argument(
      "file",
      metavar="FILE",
      help="a program file, or with --workdir an archive id or class name",
  )
  p.add_argument(
      "--workdir",
      default=None,
      help="a run's workdir: find the program in its memory and show the"
      " hint the run wrote for it",
  )
  p.add_argument("--seed", type=int, default=None, help="episode seed")
  p.add_argument(
      "--show-hint", action="store_true", help="print hint() at the start"
  )
  p.add_argument(
      "--backend",
      default="gvisor",
      choices=("gvisor", "bwrap", "none"),
      help="sandbox backend (none: trusted code only)",
  )
  return p.parse_args(argv)


def _hint_text(env, written: str | None) -> str:
  """The hint an episode would see: the run's written one, else hint()."""
  if written is not None:
    return written
  hint = env.hint()
  if hint is None:
    return (
        "(this program defines no hint(); a run's written hint is shown"
        " with --workdir RUN)"
    )
  return str(hint)


def play(env, seed, show_hint, lines, out, written_hint=None) -> float:
  """Plays one episode of a `ProgramEnv`; returns the total reward.

  The hint (`written_hint` when given, else the program's `hint()` for the
  episode) comes before the first observation, as a hinted episode sees it.
  """
  obs, _ = env.reset(seed=seed)
  if show_hint:
    out.write(f"[hint] {_hint_text(env, written_hint)}\n")
  out.write(f"{obs}\n")
  out.flush()
  has_tools = bool(env.get_tools())
  total = 0.0
  for raw in lines:
    action = raw.rstrip("\n")
    if action == ":quit":
      break
    if action == ":hint":
      out.write(f"[hint] {_hint_text(env, written_hint)}\n")
      continue
    if action == ":tools":
      out.write(json.dumps(env.get_tools(), indent=1) + "\n")
      continue
    replies = tool_calls.reply_actions(action, has_tools)
    if replies[0][0] == "tool":
      for _, call in replies:
        result = env.execute_tool(call["name"], call["arguments"])
        out.write(f"[tool {call['name']}] {result.get('output', '')}\n")
      out.flush()
      continue
    obs, reward, terminated, truncated, info = env.step(action)
    total += reward
    out.write(f"{obs}\n[reward {reward:+.2f}  total {total:+.2f}]\n")
    if info.get("error"):
      out.write(f"[error {info['error']}] {info.get('message', '')}\n")
    if terminated or truncated:
      status = (
          "won"
          if terminated and reward >= 1.0
          else ("truncated" if truncated else "over")
      )
      out.write(f"[episode {status}]\n")
      break
    out.flush()
  return total


def find_in_run(workdir: str, target: str) -> tuple[str, str | None]:
  """(source, written hint) of the run's archived program `target`: an
  archive id, a class name, or a file whose contents were archived.

  Raises:
    LookupError: no such program (the message lists what the run has).
  """
  from spade.memory import archive  # pylint: disable=g-import-not-at-top

  path = os.path.join(workdir, archive.MEMORY_FILE)
  if not os.path.exists(path):
    raise LookupError(
        f"{path} does not exist: a run writes it at every checkpoint; check"
        " --workdir"
    )
  with open(path, encoding="utf-8") as f:
    entries = json.load(f).get("entries", [])
  source = None
  if os.path.isfile(target):
    with open(target, encoding="utf-8") as f:
      source = f.read()
  for e in entries:
    verdict = e.get("verdict") or {}
    if (
        e.get("id") == target
        or verdict.get("class_name") == target
        or (source is not None and e.get("code") == source)
    ):
      return e["code"], verdict.get("written_hint")
  if source is not None:
    return source, None
  known = ", ".join(
      f"{e.get('id')} ({(e.get('verdict') or {}).get('class_name') or '-'})"
      for e in entries[:20]
  )
  raise LookupError(
      f"{workdir}'s memory has no program {target!r}; it has: {known or 'none'}"
      " (python -m spade.memory.show WORKDIR lists them)"
  )


def main(argv: list[str] | None = None) -> int:
  """Runs the CLI; returns the exit status."""
  args = _parse(argv)
  from spade.environments import gym_adapter  # pylint: disable=g-import-not-at-top
  from spade.sandbox import SandboxError  # pylint: disable=g-import-not-at-top

  written = None
  try:
    if args.workdir:
      source, written = find_in_run(args.workdir, args.file)
    else:
      with open(args.file, encoding="utf-8") as f:
        source = f.read()
  except OSError as e:
    print(f"cannot read {args.file}: {e}", file=sys.stderr)
    return 2
  except LookupError as e:
    print(str(e).strip("'\""), file=sys.stderr)
    return 2
  try:
    env = gym_adapter.ProgramEnv(source, backend=args.backend)
  except SandboxError as e:
    print(
        f"the program did not start ({e.reason}): {e.message}",
        file=sys.stderr,
    )
    return 1
  try:
    play(env, args.seed, args.show_hint, sys.stdin, sys.stdout, written)
  finally:
    env.close()
  return 0


if __name__ == "__main__":
  sys.exit(main())
