r"""SPADE against the fixed-pool baseline at equal compute: the learning table.

  python experiments/learning_table.py --config=configs/qwen2p5_coder_0p5b.py \
      --workdir=/tmp/learning --iterations=20 --suites=seed_heldout,tool_use \
      --num_examples=32

Meant for an accelerator. It trains two runs from the same initial weights:

  spade       the full loop (designer + agent, regret-trained designer);
  fixed_pool  `train.mode="fixed_pool"`: the agent plays the seed library
              (training part) alone, the same number of environments and
              episodes per iteration, for the same number of iterations.

Both play `designer.num_envs x agent.episodes_per_env x 2` episodes an
iteration, so the agent's training compute is equal; SPADE additionally
spends compute on designing. Before and after training, the agent's no-hint
score is measured on the held-out seed environments and on each eval suite.
The table (markdown) goes to stdout and WORKDIR/learning_table.md, with the
per-iteration designer validity rate and mean regret from metrics.jsonl.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags

from spade import config as config_lib
from spade import console
from spade.eval import __main__ as eval_main
from spade.selfplay import loop
from spade.selfplay import metrics as metrics_lib

# --config and --workdir are spade.main's flags, --num_examples
# spade.eval's (both modules are imported above and define them).
FLAGS = flags.FLAGS
_ITERS = flags.DEFINE_integer("iterations", 20, "Training iterations per run.")
_SUITES = flags.DEFINE_list(
    "suites", ["seed_heldout"], "Eval suites before and after."
)


def _scores(config, workdir: str) -> dict[str, float]:
  out = {}
  for suite in _SUITES.value:
    result = eval_main.evaluate_workdir(
        config, workdir, suite, FLAGS.num_examples
    )
    out[suite] = float(result["score"])
  return out


def main(argv):
  console.no_tpu_probe()  # before JAX starts a backend: no libtpu page
  del argv
  base = FLAGS.config
  base.num_iterations = _ITERS.value
  config_lib.validate(base)
  rows = {}
  for mode in ("spade", "fixed_pool"):
    config = config_lib.ConfigDict(base.to_dict())
    config.train.mode = mode
    workdir = os.path.join(FLAGS.workdir, mode)
    os.makedirs(workdir, exist_ok=True)
    before = _scores(config, workdir)  # no checkpoint yet: initial weights
    loop.train_and_evaluate(config, workdir)
    after = _scores(config, workdir)
    metrics = metrics_lib.read_metrics(workdir)
    rows[mode] = {"before": before, "after": after, "metrics": metrics}

  lines = ["| run | suite | before | after |", "|---|---|---|---|"]
  for mode, r in rows.items():
    for suite in _SUITES.value:
      lines.append(
          f"| {mode} | {suite} | {r['before'][suite]:.3f} |"
          f" {r['after'][suite]:.3f} |"
      )
  lines += ["", "| iteration | valid rate | mean regret | return no hint |"]
  lines.append("|---|---|---|---|")
  for m in rows["spade"]["metrics"]:
    lines.append(
        f"| {m['step']} | {m['designer/valid_rate']:.2f} |"
        f" {m['regret/mean']:.3f} | {m['agent/return_nohint']:.3f} |"
    )
  table = "\n".join(lines)
  print(table)
  with open(os.path.join(FLAGS.workdir, "learning_table.md"), "w") as f:
    f.write(table + "\n")
  with open(os.path.join(FLAGS.workdir, "learning_table.json"), "w") as f:
    json.dump(
        {
            k: {"before": v["before"], "after": v["after"]}
            for k, v in rows.items()
        },
        f,
        indent=1,
    )


if __name__ == "__main__":
  flags.mark_flags_as_required(["config", "workdir"])
  app.run(main)
