"""Plays an environment program in the terminal.

  python -m spade.environments.play FILE [--seed N] [--show-hint]
      [--backend gvisor|bwrap|none]

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
import sys

from spade.environments import tool_calls


def _parse(argv: list[str] | None) -> argparse.Namespace:
  p = argparse.ArgumentParser(
      prog="python -m spade.environments.play",
      description="Play an environment program in the terminal.",
  )
  p.add_argument("file", metavar="FILE")
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


def play(env, seed, show_hint, lines, out) -> float:
  """Plays one episode of a `ProgramEnv`; returns the total reward."""
  obs, _ = env.reset(seed=seed)
  out.write(f"{obs}\n")
  if show_hint:
    out.write(f"[hint] {env.hint()}\n")
  has_tools = bool(env.get_tools())
  total = 0.0
  for raw in lines:
    action = raw.rstrip("\n")
    if action == ":quit":
      break
    if action == ":hint":
      out.write(f"[hint] {env.hint()}\n")
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


def main(argv: list[str] | None = None) -> int:
  """Runs the CLI; returns the exit status."""
  args = _parse(argv)
  from spade.environments import gym_adapter  # pylint: disable=g-import-not-at-top
  from spade.sandbox import SandboxError  # pylint: disable=g-import-not-at-top

  try:
    with open(args.file, encoding="utf-8") as f:
      source = f.read()
  except OSError as e:
    print(f"cannot read {args.file}: {e}", file=sys.stderr)
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
    play(env, args.seed, args.show_hint, sys.stdin, sys.stdout)
  finally:
    env.close()
  return 0


if __name__ == "__main__":
  sys.exit(main())
