"""Writes notebooks/quickstart.ipynb from the cells below (the reviewable form).

  python notebooks/make_quickstart.py            # write the notebook
  python notebooks/make_quickstart.py --check    # exit 1 if it is stale

Edit the cells here, never the .ipynb: tests/test_notebook.py checks that the
notebook equals what this script writes, then runs it top to bottom.
"""

from __future__ import annotations

import os
import sys

import nbformat

HERE = os.path.dirname(os.path.abspath(__file__))
NOTEBOOK = os.path.join(HERE, "quickstart.ipynb")

INTRO = """\
# SPADE quickstart

One transformer plays two roles. The **Environment Designer** writes Python
programs that are multi-turn environments (`reset()` / `step()`, a reward, a
hint); the **Reasoning Agent** plays them with and without that privileged
hint. The designer is trained on the agent's **regret** (its return with the
hint minus its return without), the agent on its own returns.

This notebook installs SPADE, runs the tiny config for a few self-play
iterations on whatever runtime it has (CPU, or a TPU runtime), plots the
designer's validity rate, the regret and the agent's return with and without
the hint, then shows one environment's code and plays a few turns of it in
the sandbox. The tiny config is a randomly initialised byte-level model: it
proves the pipeline, not learning (its designs are mostly invalid, so the
agent falls back to the seed library). For real runs see `configs/` and
`launch/README.md`.
"""

INSTALL = """\
# Installs SPADE when it is not importable yet (a fresh Colab runtime); in a
# checkout with `pip install -e .` this cell does nothing.
import glob
import importlib
import importlib.util
import os
import subprocess
import sys

SPADE_REPO = os.environ.get("SPADE_REPO", "")  # git URL of this repository
SPADE_DIR = "/content/spade"

if importlib.util.find_spec("spade") is None:
  if not SPADE_REPO:
    raise RuntimeError(
        "SPADE is not installed: set SPADE_REPO = '<git URL of the SPADE "
        "repository>' at the top of this cell and run it again"
    )
  if not os.path.isdir(SPADE_DIR):
    subprocess.run(
        ["git", "clone", "--depth=1", SPADE_REPO, SPADE_DIR], check=True
    )
  packages = ["-e", SPADE_DIR + "[eval]", "matplotlib"]
  if glob.glob("/dev/accel*") or os.environ.get("COLAB_TPU_ADDR"):
    packages.append("jax[tpu]")  # a TPU runtime: keep JAX's TPU backend
  subprocess.run([sys.executable, "-m", "pip", "install", "-q", *packages],
                 check=True)
  # The designer's programs run in gVisor (runsc), else bubblewrap.
  subprocess.run("apt-get -qq update && (apt-get -qq install -y runsc "
                 "bubblewrap || apt-get -qq install -y bubblewrap)",
                 shell=True, check=False)
  # An editable install is seen by new interpreters; make it visible here.
  sys.path.insert(0, SPADE_DIR)
  importlib.invalidate_caches()

import spade

print("SPADE from", os.path.dirname(spade.__file__))
"""

SETTINGS_MD = """\
## Settings

The run uses `configs/tiny.py` as is, for a few iterations; under the test
suite (`SPADE_NOTEBOOK_TEST=1`) it takes the `smoke` variant for two. The
sandbox backend is gVisor when `runsc` is installed, else bubblewrap (which
shares the host kernel; announced below). Starting again on the same
`WORKDIR` resumes the run from its newest checkpoint.
"""

SETTINGS = """\
import pathlib
import shutil
import tempfile

import jax

from spade import config as config_lib

TEST = os.environ.get("SPADE_NOTEBOOK_TEST") == "1"
ROOT = pathlib.Path(spade.__file__).resolve().parent.parent
if not (ROOT / "configs" / "tiny.py").exists():
  ROOT = pathlib.Path(SPADE_DIR)


def load_config(path, arg=None):
  \"\"\"Loads a config file the way `--config=path:arg` does.\"\"\"
  spec = importlib.util.spec_from_file_location(pathlib.Path(path).stem, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


config = load_config(ROOT / "configs" / "tiny.py", "smoke" if TEST else None)
config.num_iterations = 2 if TEST else 4
if shutil.which("runsc"):
  config.sandbox.backend = "gvisor"
elif shutil.which("bwrap"):
  config.sandbox.backend = "bwrap"
  print("gVisor's runsc is missing: using bubblewrap, which shares the host "
        "kernel (apt-get install runsc for the real isolation)")
else:
  raise RuntimeError(
      "no sandbox for the designer's programs: apt-get install runsc "
      "(or bubblewrap), then run this cell again"
  )
config_lib.validate(config)

WORKDIR = os.environ.get("SPADE_NOTEBOOK_WORKDIR") or tempfile.mkdtemp(
    prefix="spade_quickstart_"
)
print("devices:", jax.devices())
print("sandbox:", config.sandbox.backend, "| workdir:", WORKDIR)
print("iterations:", config.num_iterations, "| environments/iteration:",
      config.designer.num_envs, "| episodes/env:",
      config.agent.episodes_per_env, "x2 (with and without hint)")
"""

RUN = """\
import time

from spade.selfplay import loop

start = time.perf_counter()
loop.train_and_evaluate(config, WORKDIR)
print(f"{config.num_iterations} iterations in "
      f"{time.perf_counter() - start:.0f} s")
"""

PLOT_MD = """\
## What happened

Every iteration appends one JSON line to `WORKDIR/metrics.jsonl`.
"""

PLOT = """\
%matplotlib inline
import math

import matplotlib.pyplot as plt

from spade.selfplay import metrics as metrics_lib

rows = metrics_lib.read_metrics(WORKDIR)
steps = [r["step"] for r in rows]


def series(key):
  return [math.nan if r.get(key) is None else r[key] for r in rows]


fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
axes[0].plot(steps, series("designer/valid_rate"), "o-")
axes[0].set(title="designer: valid programs", xlabel="iteration",
            ylim=(-0.05, 1.05))
axes[1].plot(steps, series("regret/mean"), "o-", color="tab:red")
axes[1].set(title="regret (hint gap, mean)", xlabel="iteration")
axes[2].plot(steps, series("agent/return_nohint"), "o-", label="without hint")
axes[2].plot(steps, series("agent/return_hint"), "s--", label="with hint")
axes[2].set(title="agent return", xlabel="iteration", ylim=(-0.05, 1.05))
axes[2].legend()
for ax in axes:
  ax.set_xticks(steps)  # iterations are whole numbers
fig.tight_layout()
plt.show()
print({k: v for k, v in rows[-1].items() if not k.startswith("time/")})
"""

SHOW_MD = """\
## One environment

The programs of each iteration are under `WORKDIR/programs/iter_NNNNNN/`,
with their validation verdicts. Show a valid design if the model wrote one,
else a seed environment the agent played that iteration.
"""

SHOW = """\
import json

from IPython.display import Code, display

from spade.environments import library

folder = sorted(glob.glob(os.path.join(WORKDIR, "programs", "iter_*")))[-1]
with open(os.path.join(folder, "verdicts.json")) as f:
  verdicts = json.load(f)
valid = [d for d in verdicts["designs"] if d["verdict"].get("valid")]
for d in verdicts["designs"][:3]:
  print(d["file"], "->", d["verdict"].get("reason"),
        str(d["verdict"].get("message", ""))[:100])
if valid:
  name = valid[0]["file"]
  with open(os.path.join(folder, name)) as f:
    source = f.read()
else:
  seed_names = [p["name"] for p in verdicts["played"] if p["origin"] == "seed"]
  name = seed_names[0] if seed_names else library.train_programs()[0].name
  source = library.get_program(name).source
print(f"showing {name} ({'designed' if valid else 'seed library'})")
display(Code(source, language="python"))
"""

PLAY = """\
from spade.environments import sandboxes
from spade.sandbox import pool as pool_lib

TURNS = 12
with sandboxes.from_config(config.sandbox) as pool:
  handle = pool.create(source)
  observation, info = pool.reset(handle, seed=0)
  print("observation:", observation[:400])
  try:
    print("hint:", str(pool.call(handle, "hint"))[:200])
  except pool_lib.SandboxError as e:
    print("no hint():", e)
  # The environment's own solution, if it has a replayable one; otherwise a
  # few generic moves. The agent's actual episodes are in the run above.
  try:
    plan = pool.call(handle, "solution")
  except pool_lib.SandboxError:
    plan = None
  actions = plan if isinstance(plan, list) and plan else [
      "\\\\boxed{1}", "\\\\boxed{2}", "\\\\boxed{3}"]
  for turn, action in enumerate(actions[:TURNS], start=1):
    result = pool.step(handle, str(action))
    if not result["ok"]:
      print(f"turn {turn}: error {result['reason']}: {result['message']}")
      break
    print(f"turn {turn}: action {str(action)[:60]!r} -> reward "
          f"{result['reward']}, done {result['terminated']}")
    print("   ", result["obs"][:200].replace("\\n", "\\n    "))
    if result["terminated"] or result["truncated"]:
      break
  pool.close_env(handle)
"""

NEXT_MD = """\
## Next

- Bigger models: `configs/gemma3_tpu.py:1b` (or `:4b`, `:12b`, `:27b`) gives the
  mesh and rollout sizes for TPU pods; each size has a `,runlocal` variant
  for CPU (`configs/gemma3_tpu.py:1b,runlocal`).
- Launch on Cloud TPU: `python launch/xm_launch.py --dry_run
  --config=configs/gemma3_tpu.py:1b --tpu=v5p-32` prints the job;
  `launch/README.md` explains the rest.
- Any override works here as on the command line: `config.agent.max_turns = 6`
  in this notebook is `--config.agent.max_turns=6` there.
"""


def build() -> nbformat.NotebookNode:
  """Returns the quickstart notebook (no outputs)."""
  nb = nbformat.v4.new_notebook()
  nb.metadata["kernelspec"] = {
      "name": "python3",
      "display_name": "Python 3",
      "language": "python",
  }
  nb.metadata["language_info"] = {"name": "python"}
  nb.metadata["colab"] = {"provenance": []}
  md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
  nb.cells = [
      md(INTRO),
      code(INSTALL),
      md(SETTINGS_MD),
      code(SETTINGS),
      code(RUN),
      md(PLOT_MD),
      code(PLOT),
      md(SHOW_MD),
      code(SHOW),
      code(PLAY),
      md(NEXT_MD),
  ]
  for i, cell in enumerate(nb.cells):
    cell["id"] = f"cell-{i:02d}"  # stable ids: a rebuild is a no-op diff
  return nb


def main(argv: list[str]) -> int:
  """Writes the notebook, or with --check reports whether it is stale."""
  text = nbformat.writes(build())
  if "--check" in argv:
    with open(NOTEBOOK) as f:
      stale = f.read() != text
    if stale:
      print(f"{NOTEBOOK} is stale: run python notebooks/make_quickstart.py")
    return int(stale)
  with open(NOTEBOOK, "w") as f:
    f.write(text)
  print(f"wrote {NOTEBOOK}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
