"""Checks environment programs in the sandbox and prints one verdict each.

  python -m spade.environments.check [--json] [--backend gvisor|bwrap|none]
      [--budgets reference|strict] [--call-timeout S] [--timeout S]
      [--max-context TOKENS] [--require PROPERTY]... FILE...

Every file is validated (`validator.validate_program`) inside the sandbox
pool; a broken or hostile file yields its own verdict and never stops the
others. A file is valid when the reference's checks accept it (and it is not
hostile or over its per-call budget); the stricter checks are listed as
properties, and --require makes any of them (`contract.PROPERTIES`)
necessary, as `environments.require` does in a config. With --json, each
line is one JSON object with at least file, valid, reason, message and
properties. The exit status is 0 when every file is valid, 1 when any is
not, 2 when the sandbox cannot start.

The budgets are the loop's (`spade.environments.budget`, the config's
`sandbox.budgets`): by default the reference's, 30 s of CPU a call and 60 s
for the validator, so a program the loop would play is valid here too;
`--budgets strict` is ours (0.5 s a call). --call-timeout and --timeout
replace one budget when > 0, as `sandbox.call_timeout_s` and
`sandbox.validate_timeout_s` do.
"""

from __future__ import annotations

import argparse
import json
import sys

from spade.environments import budget
from spade.environments import contract


def _parse(argv: list[str] | None) -> argparse.Namespace:
  p = argparse.ArgumentParser(
      prog="python -m spade.environments.check",
      description="Validate environment programs inside the sandbox.",
  )
  p.add_argument("files", nargs="+", metavar="FILE", help="program files")
  p.add_argument("--json", action="store_true", help="one JSON line a file")
  p.add_argument(
      "--backend",
      default="gvisor",
      choices=("gvisor", "bwrap", "none"),
      help="sandbox backend (none: trusted code only)",
  )
  p.add_argument("--num-sandboxes", type=int, default=2)
  p.add_argument(
      "--budgets",
      default=budget.DEFAULT,
      choices=tuple(budget.BUDGETS),
      help="the loop's named limits (sandbox.budgets)",
  )
  p.add_argument(
      "--timeout",
      type=float,
      default=0.0,
      help="hard deadline of one validation, seconds (0: the budgets')",
  )
  p.add_argument(
      "--max-context",
      type=int,
      default=0,
      help=(
          "the agent's context in tokens, which caps a call's output under"
          " the reference budgets (0: the reference's 32,768)"
      ),
  )
  p.add_argument("--seed", type=int, default=0, help="episode seed checked")
  p.add_argument("--smoke-steps", type=int, default=contract.SMOKE_STEPS)
  p.add_argument(
      "--call-timeout",
      type=float,
      default=0.0,
      help="budget of one reset/step/tool call, CPU seconds (0: the budgets')",
  )
  p.add_argument(
      "--require",
      action="append",
      default=[],
      choices=contract.PROPERTIES,
      metavar="PROPERTY",
      help=(
          "a property a valid file must have (repeatable): "
          + ", ".join(contract.PROPERTIES)
      ),
  )
  return p.parse_args(argv)


def _read(path: str) -> tuple[str | None, dict | None]:
  """The file's text, or a verdict saying why it could not be read."""
  try:
    with open(path, encoding="utf-8") as f:
      return f.read(), None
  except (OSError, UnicodeDecodeError) as e:
    return None, {
        "valid": False,
        "reason": "unreadable",
        "message": f"cannot read the file: {e}",
    }


def check_files(
    paths: list[str],
    pool,
    *,
    seed: int = 0,
    smoke_steps: int = contract.SMOKE_STEPS,
    limits: budget.Budgets | None = None,
    budgets: str = budget.DEFAULT,
    require: tuple[str, ...] = (),
) -> list[dict]:
  """Validates files in `pool`; returns one verdict (with "file") each.

  `limits` (default: `budgets`' own) give the per-call budget and the output
  cap, as `validator.options_from_config` gives them to the loop.
  """
  limits = limits or budget.resolve(budgets)
  verdicts: list[dict | None] = []
  sources, where = [], []
  for i, path in enumerate(paths):
    text, failure = _read(path)
    verdicts.append(failure)
    if text is not None:
      sources.append(text)
      where.append(i)
  if sources:
    results = pool.validate(
        sources,
        seed=seed,
        smoke_steps=smoke_steps,
        budgets=budgets,
        call_timeout_s=limits.call_timeout_s,
        max_output_chars=limits.max_output_chars,
        require=tuple(require),
        filename="<env>",
    )
    for i, verdict in zip(where, results):
      verdicts[i] = verdict
  return [{"file": path, **v} for path, v in zip(paths, verdicts)]


def _line(v: dict) -> str:
  if v["valid"]:
    extra = " (hint)" if v.get("has_hint") else ""
    if v.get("solution_replayed"):
      extra += f" (solution wins in {v.get('solution_steps')} steps"
      calls = v.get("solution_tool_calls")
      extra += f" and {calls} tool calls)" if calls else ")"
    lacking = [p for p, ok in (v.get("properties") or {}).items() if not ok]
    if lacking:
      extra += f" [not {', '.join(lacking)}]"
    return f"{v['file']}: ok {v.get('class_name', '')}{extra}"
  return f"{v['file']}: INVALID [{v['reason']}] {v['message']}"


def main(argv: list[str] | None = None) -> int:
  """Runs the CLI; returns the exit status."""
  args = _parse(argv)
  # Imported here so that --help works without the sandbox's dependencies.
  from spade.sandbox import SandboxError  # pylint: disable=g-import-not-at-top
  from spade.sandbox import SandboxPool  # pylint: disable=g-import-not-at-top

  limits = budget.resolve(
      args.budgets,
      call_timeout_s=args.call_timeout,
      validate_timeout_s=args.timeout,
      max_context_tokens=args.max_context or None,
  )
  try:
    pool = SandboxPool(
        args.backend,
        num_sandboxes=max(1, min(args.num_sandboxes, len(args.files))),
        step_timeout_s=limits.load_timeout_s,
        call_timeout_s=limits.call_timeout_s,
        validate_timeout_s=limits.validate_timeout_s,
        warm_spare=False,
    )
  except SandboxError as e:
    print(
        f"cannot start the sandbox ({e.reason}): {e.message}", file=sys.stderr
    )
    return 2
  with pool:
    verdicts = check_files(
        args.files,
        pool,
        seed=args.seed,
        smoke_steps=args.smoke_steps,
        limits=limits,
        budgets=args.budgets,
        require=tuple(args.require),
    )
  for v in verdicts:
    print(json.dumps(v) if args.json else _line(v), flush=True)
  return 0 if all(v["valid"] for v in verdicts) else 1


if __name__ == "__main__":
  sys.exit(main())
