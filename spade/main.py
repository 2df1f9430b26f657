r"""SPADE entry point: one model designs environments and learns to solve them.

  python -m spade.main --config=configs/tiny.py --workdir=/tmp/spade_tiny \
      --config.num_iterations=4

Every experiment setting is in the config (`configs/*.py`, overridable with
`--config.a.b=value`); the flags here say only where to run and write. Starting
again on the same `--workdir` resumes from its latest checkpoint.
"""

from __future__ import annotations

import sys

from absl import app
from absl import flags
from ml_collections import config_flags

from spade import console

# Before the config file is loaded (a config may start JAX's backends).
console.no_tpu_probe()

from spade import config as config_lib  # pylint: disable=g-import-not-at-top

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file, e.g. configs/tiny.py or configs/tiny.py:smoke"
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Directory for checkpoints, metrics and programs."
)
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address",
    None,
    "host:port of process 0 for multi-host runs; absent: single process.",
)
_NUM_PROCESSES = flags.DEFINE_integer(
    "num_processes", None, "Number of processes in a multi-host run."
)
_PROCESS_ID = flags.DEFINE_integer(
    "process_id", None, "This process's index in a multi-host run."
)
_VERBOSE = flags.DEFINE_bool(
    "verbose",
    False,
    "Also print the libraries' INFO lines (absl, orbax, jax) and SPADE's"
    " detailed log; off, the console shows SPADE's progress lines only.",
)


def _fail(message: str) -> None:
  """Prints one line and exits non-zero: config errors need no traceback."""
  print(f"spade: error: {message}", file=sys.stderr)
  sys.exit(2)


def parse_flags(argv: list[str]) -> list[str]:
  """Parses flags; a bad `--config.*` override is a one-line error."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    _fail(str(e).splitlines()[0])
  except (KeyError, AttributeError) as e:
    key = str(e).strip("\"' ")
    bad = [a for a in argv[1:] if a.startswith("--config.") and key in a]
    _fail(f"unknown config key {key!r} in {' '.join(bad) or 'the overrides'}")
  except (TypeError, ValueError) as e:
    _fail(f"bad config override: {e}")
  return []


def load_config():
  """Returns the validated config from the flags, or exits with one line."""
  if _CONFIG.value is None:
    _fail("--config is required, e.g. --config=configs/tiny.py")
  if not _WORKDIR.value:
    _fail("--workdir is required")
  config = _CONFIG.value
  try:
    config_lib.validate(config)
  except config_lib.ConfigError as e:
    _fail(str(e))
  return config


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    _fail(f"unexpected arguments: {' '.join(argv[1:])}")
  config = load_config()
  console.quiet(verbose=_VERBOSE.value)
  if _COORDINATOR.value is not None or _NUM_PROCESSES.value is not None:
    import jax  # pylint: disable=g-import-not-at-top

    jax.distributed.initialize(
        coordinator_address=_COORDINATOR.value,
        num_processes=_NUM_PROCESSES.value,
        process_id=_PROCESS_ID.value,
    )
  # Heavy imports only after the config is known to be good.
  from spade.selfplay import loop  # pylint: disable=g-import-not-at-top

  console.say("workdir %s", _WORKDIR.value)
  try:
    loop.train_and_evaluate(config, _WORKDIR.value)
  except config_lib.ConfigError as e:  # found once the model is known
    _fail(str(e))


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
