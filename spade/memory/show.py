r"""Shows a run's environment archive.

  python -m spade.memory.show WORKDIR            # every entry, oldest first
  python -m spade.memory.show WORKDIR --top 10   # the 10 highest-regret
  python -m spade.memory.show WORKDIR --dump env-000012   # one program

Reads WORKDIR/memory.json, which the training loop writes at every checkpoint
(`Archive.state_dict()`). The table has one row per environment: id,
iteration written, verdict (ok or the validator's reason code), latest regret,
latest win rates with and without hint, times played, and the description.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

from spade.memory import archive as archive_lib


def load(workdir: str) -> dict:
  """Reads the archive state a run saved in `workdir`."""
  path = os.path.join(workdir, archive_lib.MEMORY_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(
        f"{path} does not exist: the training loop writes it at each "
        "checkpoint; check the workdir, or wait for the first checkpoint"
    )
  with open(path) as f:
    return json.load(f)


def _fmt(x: float | None) -> str:
  return "-" if x is None else f"{x:.2f}"


def table(entries: list[archive_lib.Entry], width: int = 120) -> str:
  """Formats entries as a fixed-width table, one line each."""
  header = (
      f"{'id':<11} {'iter':>4} {'verdict':<14} {'regret':>6} "
      f"{'win+h':>5} {'win-h':>5} {'plays':>5}  description"
  )
  room = max(width - len(header) + len("description"), 20)
  lines = [header, "-" * min(width, len(header) + room - len("description"))]
  for e in entries:
    s = e.stats
    verdict = "ok" if e.valid else str(e.verdict.get("reason") or "invalid")
    desc = e.description or "(no docstring)"
    if len(desc) > room:
      desc = desc[: room - 3] + "..."
    lines.append(
        f"{e.id:<11} {e.iteration:>4} {verdict[:14]:<14} "
        f"{_fmt(e.latest_regret):>6} "
        f"{_fmt(s.win_rate_hint[-1] if s.win_rate_hint else None):>5} "
        f"{_fmt(s.win_rate_nohint[-1] if s.win_rate_nohint else None):>5} "
        f"{s.times_played:>5}  {desc}"
    )
  return "\n".join(lines)


def top_entries(entries: list[archive_lib.Entry], n: int):
  """The `n` highest latest-regret entries; never-played ones last."""
  return sorted(
      entries,
      key=lambda e: (e.latest_regret is None, -(e.latest_regret or 0.0)),
  )[:n]


def dump(entry: archive_lib.Entry) -> str:
  """One entry in full: header lines, then its code."""
  s = entry.stats
  lines = [
      f"# {entry.id}  iteration {entry.iteration}  parent "
      f"{entry.lineage.parent or '-'}  grounding {entry.grounding_id or '-'}",
      f"# verdict: {'ok' if entry.valid else entry.reason}",
      f"# regret by play: {[round(r, 3) for r in s.regret]}",
      f"# win rates (hint / no hint): "
      f"{[round(w, 3) for w in s.win_rate_hint]} / "
      f"{[round(w, 3) for w in s.win_rate_nohint]}",
      f"# played {s.times_played} times, {s.episodes} episodes",
      "",
      entry.code,
  ]
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
  """The CLI; returns the exit status."""
  parser = argparse.ArgumentParser(
      prog="python -m spade.memory.show", description=__doc__.splitlines()[0]
  )
  parser.add_argument("workdir", help="the run's --workdir")
  parser.add_argument(
      "--top", type=int, default=0, help="show the N highest-regret entries"
  )
  parser.add_argument("--dump", metavar="ID", help="print one entry's code")
  args = parser.parse_args(argv)
  try:
    state = load(args.workdir)
  except (FileNotFoundError, json.JSONDecodeError) as e:
    print(f"spade.memory.show: error: {e}", file=sys.stderr)
    return 2
  entries = [archive_lib.Entry.from_dict(d) for d in state["entries"]]
  if args.dump:
    match = [e for e in entries if e.id == args.dump]
    if not match:
      print(
          f"spade.memory.show: error: no entry {args.dump!r} in "
          f"{args.workdir} (ids: {', '.join(e.id for e in entries[:5])}"
          f"{', ...' if len(entries) > 5 else ''})",
          file=sys.stderr,
      )
      return 2
    print(dump(match[0]))
    return 0
  if args.top < 0:
    print("spade.memory.show: error: --top must be >= 0", file=sys.stderr)
    return 2
  shown = top_entries(entries, args.top) if args.top else entries
  print(table(shown, shutil.get_terminal_size((120, 24)).columns))
  print(
      f"\n{len(entries)} environments, {sum(e.valid for e in entries)} valid,"
      f" {state['duplicates_rejected']} duplicates rejected,"
      f" {state['evicted']} evicted"
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
