r"""Evaluates the agent on one held-out suite and prints a JSON summary.

  python -m spade.eval --config=configs/tiny.py --workdir=/tmp/spade_tiny \
      --suite=reasoning_gym --num_examples=8

Loads the latest checkpoint in `--workdir` (the config's initial weights when
there is none), plays the agent role, prints one log line per item and, as
the LAST line of stdout, one JSON object with at least `suite`, `score` (0 to
1) and `num_examples`. The per-item results are also written to
`<workdir>/eval/<suite>.jsonl`. Suites: reasoning_gym, humaneval, tool_use,
seed_heldout (the last two execute code only in the sandbox pool of
`config.sandbox`).
"""

from __future__ import annotations

import json
import os
import sys

from absl import app
from absl import flags
from absl import logging

from spade import cli
from spade.eval import registry
from spade.eval import runner

_SUITE = flags.DEFINE_enum(
    "suite", None, sorted(registry.SUITES), "The suite to run."
)
_NUM_EXAMPLES = flags.DEFINE_integer(
    "num_examples", None, "Items to evaluate; default config.eval.num_examples."
)


def _fail(message: str) -> None:
  """One line on stderr and exit status 2, like `spade.main`."""
  print(f"spade.eval: error: {message}", file=sys.stderr)
  sys.exit(2)


def load_agent_params(config, workdir: str):
  """The parameters to evaluate: the workdir's latest checkpoint, else initial.

  This is the one place that chooses the weights: the newest readable
  checkpoint the training loop wrote in `workdir`
  (`spade.train.checkpoints.latest_params`), or, when there is none, the
  config's initial weights (`spade.model.loading.initial_params`).

  Returns:
    (params, a description of where they came from).
  """
  from spade.model import loading  # pylint: disable=g-import-not-at-top
  from spade.train import checkpoints as train_checkpoints  # pylint: disable=g-import-not-at-top

  params = train_checkpoints.latest_params(config, workdir)
  if params is not None:
    return params, f"latest checkpoint in {workdir}"
  where = config.checkpoint.kind
  return loading.initial_params(config), f"initial weights ({where})"


def _write_items(workdir: str, result: registry.SuiteResult) -> str:
  path = os.path.join(workdir, "eval", f"{result.suite}.jsonl")
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    for item in result.items:
      f.write(
          json.dumps(
              {
                  "id": item.item_id,
                  "score": item.score,
                  "detail": item.detail,
                  "reply": item.reply,
              }
          )
          + "\n"
      )
  return path


def evaluate_workdir(
    config, workdir: str, suite_name: str, num_examples: int
) -> dict:
  """Runs one suite on the workdir's agent; returns the JSON summary.

  Per-item lines go to stdout as they are scored; the items are also written
  to `<workdir>/eval/<suite>.jsonl`.
  """
  os.makedirs(workdir, exist_ok=True)
  suite = runner.build(suite_name, config)

  from spade.eval import responder as responder_lib  # pylint: disable=g-import-not-at-top

  params, source = load_agent_params(config, workdir)
  print(f"[{suite.name}] evaluating the agent with {source}", flush=True)
  model = responder_lib.ModelResponder(config, params, seed=config.seed)
  log = lambda line: print(line, flush=True)
  if suite.needs_pool:
    from spade.environments import sandboxes  # pylint: disable=g-import-not-at-top

    with sandboxes.from_config(config.sandbox) as pool:
      result = suite.run(model, num_examples=num_examples, pool=pool, log=log)
  else:
    result = suite.run(model, num_examples=num_examples, log=log)
  path = _write_items(workdir, result)
  logging.info("per-item results in %s", path)
  return dict(result.summary(), weights=source)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    _fail(f"unexpected arguments: {' '.join(argv[1:])}")
  config = cli.load_config()
  if _SUITE.value is None:
    _fail(f"--suite is required: one of {sorted(registry.SUITES)}")
  num_examples = _NUM_EXAMPLES.value
  if num_examples is None:
    num_examples = config.eval.num_examples
  if num_examples < 1:
    _fail(f"--num_examples={num_examples} must be >= 1")
  from spade.sandbox import pool as pool_lib  # pylint: disable=g-import-not-at-top

  try:
    summary = evaluate_workdir(
        config, flags.FLAGS.workdir, _SUITE.value, num_examples
    )
  except registry.EvalError as e:
    _fail(str(e))
  except pool_lib.SandboxError as e:
    _fail(f"sandbox: {e.reason}: {e.message}")
  # The summary is the last line of stdout, for scripts to read.
  sys.stdout.write(json.dumps(summary) + "\n")
  sys.stdout.flush()


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
