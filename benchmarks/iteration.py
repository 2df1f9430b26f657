r"""One SPADE iteration on the tiny config: where the seconds go.

  python benchmarks/iteration.py [--config=configs/tiny.py] [--iterations=2]

Runs the real loop (designer sampling, gVisor validation, multi-turn agent
rollouts, the update) in a temporary workdir. The first iteration includes
compilation, so the figures are taken from the last one. Prints per-phase
seconds and how much of the sandbox time was hidden behind sampling (the
rollout engine steps one half of the episodes while sampling the other);
the last line is key=value pairs: iteration_s, sampling_s, sandbox_s,
rollout_sandbox_s, sandbox_hidden_s, hidden_frac, update_s.
"""

from __future__ import annotations

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from ml_collections import config_flags

from spade import config as config_lib
from spade.selfplay import loop
from spade.selfplay import metrics as metrics_lib

_CONFIG = config_flags.DEFINE_config_file("config", "configs/tiny.py")
_ITERS = flags.DEFINE_integer("iterations", 2, "Iterations; the last is timed.")


def main(argv):
  del argv
  config = _CONFIG.value
  config.num_iterations = _ITERS.value
  config.train.checkpoint_every = 10_000  # measure the loop, not orbax
  config_lib.validate(config)
  with tempfile.TemporaryDirectory() as workdir:
    loop.train_and_evaluate(config, workdir)
    rows = metrics_lib.read_metrics(workdir)
  last = rows[-1]
  for row in rows:
    print(
        f"iteration {row['step']}: total {row['time/iteration_s']:.2f}s,"
        f" sampling {row['time/sampling_s']:.2f}s, sandbox"
        f" {row['time/sandbox_s']:.2f}s ({row['time/sandbox_hidden_s']:.2f}s"
        f" hidden), update {row['time/update_s']:.2f}s"
    )
  # Validation cannot overlap sampling (the programs come from it); the
  # rollout's environment steps can, and that is what the fraction measures.
  hidden = last["time/sandbox_hidden_s"] / max(
      last["time/rollout_sandbox_s"], 1e-9
  )
  print(
      f"iteration_s={last['time/iteration_s']:.3f}"
      f" sampling_s={last['time/sampling_s']:.3f}"
      f" sandbox_s={last['time/sandbox_s']:.3f}"
      f" rollout_sandbox_s={last['time/rollout_sandbox_s']:.3f}"
      f" sandbox_hidden_s={last['time/sandbox_hidden_s']:.3f}"
      f" hidden_frac={hidden:.3f} update_s={last['time/update_s']:.3f}"
  )


if __name__ == "__main__":
  app.run(main)
