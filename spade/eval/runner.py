"""Running suites: by name from a config, and in-loop from the training loop.

`run_suites(config, params, pool, step)` is what the training loop calls every
`config.eval.every` iterations: it evaluates the agent role of `params` on
`config.eval.suites` with `config.eval.num_examples` items each and returns
`{"eval/<suite>": score}`.
"""

from __future__ import annotations

from typing import Any

from absl import logging
import ml_collections

from spade.eval import registry
from spade.eval import responder as responder_lib


def build(name: str, config: ml_collections.ConfigDict) -> registry.Suite:
  """The suite `name`, configured from `config.eval`."""
  return registry.build_suite(name, registry.eval_config(config))


def evaluate(
    name: str,
    config: ml_collections.ConfigDict,
    responder: registry.Responder,
    *,
    num_examples: int | None = None,
    pool: Any = None,
    log: registry.Log = print,
) -> registry.SuiteResult:
  """Runs one suite on `responder`; `num_examples` defaults to the config's."""
  suite = build(name, config)
  if num_examples is None:
    num_examples = config.eval.num_examples
  return suite.run(responder, num_examples=num_examples, pool=pool, log=log)


def run_suites(
    config: ml_collections.ConfigDict,
    params: Any,
    pool: Any,
    step: int,
    *,
    mesh: Any = None,
) -> dict[str, float]:
  """Evaluates the agent role of `params` on every suite in `config.eval`.

  Args:
    config: the experiment config; `config.eval.suites` names the suites.
    params: the shared model parameters.
    pool: the trainer's SandboxPool (humaneval and seed_heldout need it).
    step: the training iteration, logged and used as the sampling seed.
    mesh: the device mesh `params` are sharded over, if any.

  Returns:
    {"eval/<suite>": score in [0, 1]} for each configured suite.
  """
  model = responder_lib.ModelResponder(config, params, seed=step, mesh=mesh)
  metrics = {}
  for name in config.eval.suites:
    result = evaluate(
        name,
        config,
        model,
        pool=pool,
        log=lambda line: logging.info("%s", line),
    )
    logging.info("eval step %d: %s", step, result.summary())
    metrics[f"eval/{name}"] = result.score
  return metrics
