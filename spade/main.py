r"""SPADE entry point: one model designs environments and learns to solve them.

  python -m spade.main --config=configs/tiny.py --workdir=/tmp/spade_tiny \
      --config.num_iterations=4

Every experiment setting is in the config (`configs/*.py`, overridable with
`--config.a.b=value`); the flags (`spade.cli`) say only where to run and
write. Starting again on the same `--workdir` resumes from its latest
checkpoint.
"""

from __future__ import annotations

from absl import app

from spade import cli
from spade import config as config_lib
from spade import console


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    cli.fail(f"unexpected arguments: {' '.join(argv[1:])}")
  config = cli.load_config()
  console.quiet(verbose=cli.VERBOSE.value)
  if cli.COORDINATOR.value is not None or cli.NUM_PROCESSES.value is not None:
    import jax  # pylint: disable=g-import-not-at-top

    jax.distributed.initialize(
        coordinator_address=cli.COORDINATOR.value,
        num_processes=cli.NUM_PROCESSES.value,
        process_id=cli.PROCESS_ID.value,
    )
  # Heavy imports only after the config is known to be good.
  from spade.selfplay import loop  # pylint: disable=g-import-not-at-top

  console.say("workdir %s", cli.WORKDIR.value)
  try:
    loop.train_and_evaluate(config, cli.WORKDIR.value)
  except config_lib.ConfigError as e:  # found once the model is known
    cli.fail(str(e))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
