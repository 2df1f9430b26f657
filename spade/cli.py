"""The command line the entry points share: `spade.main` and `spade.eval`.

The flags say only where to run and write (`--config`, `--workdir`, a
multi-host run's process flags, `--verbose`); every experiment setting is in
the config. `parse_flags` and `load_config` turn a bad flag or config into
one line on stderr and exit status 2, not a traceback.
"""

from __future__ import annotations

import sys
from typing import NoReturn

from absl import flags
from ml_collections import config_flags

from spade import console

# Before the config file is loaded (a config may start JAX's backends).
console.no_tpu_probe()

from spade import config as config_lib  # pylint: disable=g-import-not-at-top

CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file, e.g. configs/tiny.py or configs/tiny.py:smoke"
)
WORKDIR = flags.DEFINE_string(
    "workdir", None, "Directory for checkpoints, metrics and programs."
)
COORDINATOR = flags.DEFINE_string(
    "coordinator_address",
    None,
    "host:port of process 0 for multi-host runs; absent: single process.",
)
NUM_PROCESSES = flags.DEFINE_integer(
    "num_processes", None, "Number of processes in a multi-host run."
)
PROCESS_ID = flags.DEFINE_integer(
    "process_id", None, "This process's index in a multi-host run."
)
VERBOSE = flags.DEFINE_bool(
    "verbose",
    False,
    "Also print the libraries' INFO lines (absl, orbax, jax) and SPADE's"
    " detailed log; off, the console shows SPADE's progress lines only.",
)


def fail(message: str) -> NoReturn:
  """Prints one line and exits non-zero: config errors need no traceback."""
  print(f"spade: error: {message}", file=sys.stderr)
  sys.exit(2)


def parse_flags(argv: list[str]) -> list[str]:
  """Parses flags; a bad `--config.*` override is a one-line error."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    fail(str(e).splitlines()[0])
  except (KeyError, AttributeError) as e:
    key = str(e).strip("\"' ")
    bad = [a for a in argv[1:] if a.startswith("--config.") and key in a]
    fail(f"unknown config key {key!r} in {' '.join(bad) or 'the overrides'}")
  except (TypeError, ValueError) as e:
    fail(f"bad config override: {e}")
  return []


def load_config():
  """Returns the validated config from the flags, or exits with one line."""
  if CONFIG.value is None:
    fail("--config is required, e.g. --config=configs/tiny.py")
  if not WORKDIR.value:
    fail("--workdir is required")
  return config_lib.validated(CONFIG.value, fail)
