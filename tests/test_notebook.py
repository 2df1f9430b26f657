"""The Colab quickstart is current and runs top to bottom on CPU.

The notebook runs in a python3 kernel of this interpreter with
`SPADE_NOTEBOOK_TEST=1`, which selects its small setting (tiny:smoke, two
iterations), and its workdir in a temporary folder.
"""

import base64
import importlib.util
import json
import os
import shutil

import nbformat
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "notebooks", "quickstart.ipynb")


def _generator():
  spec = importlib.util.spec_from_file_location(
      "make_quickstart", os.path.join(ROOT, "notebooks", "make_quickstart.py")
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_notebook_is_what_the_generator_writes():
  with open(NOTEBOOK) as f:
    on_disk = f.read()
  assert on_disk == nbformat.writes(_generator().build()), (
      "notebooks/quickstart.ipynb is stale: run "
      "python notebooks/make_quickstart.py"
  )
  nb = nbformat.reads(on_disk, as_version=4)
  nbformat.validate(nb)
  sources = "\n".join(c.source for c in nb.cells)
  # Colab installs SPADE only when it is not importable.
  assert 'importlib.util.find_spec("spade") is None' in sources
  assert "loop.train_and_evaluate(config, WORKDIR)" in sources


@pytest.mark.slow
@pytest.mark.sandbox
def test_quickstart_runs_top_to_bottom(tmp_path, monkeypatch):
  from nbclient import NotebookClient  # pylint: disable=g-import-not-at-top

  if not (shutil.which("runsc") or shutil.which("bwrap")):
    pytest.skip("no sandbox backend (apt-get install runsc)")
  workdir = tmp_path / "run"
  monkeypatch.setenv("SPADE_NOTEBOOK_TEST", "1")
  monkeypatch.setenv("SPADE_NOTEBOOK_WORKDIR", str(workdir))
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  # One host device, as a Colab CPU runtime has (the harness fakes eight,
  # whose in-process collectives can miss XLA's 40 s rendezvous on a
  # loaded 2-core machine and abort the kernel).
  monkeypatch.setenv("XLA_FLAGS", os.environ.get("SPADE_TEST_XLA_FLAGS", ""))
  nb = nbformat.read(NOTEBOOK, as_version=4)
  client = NotebookClient(
      nb,
      timeout=900,
      kernel_name="python3",
      resources={"metadata": {"path": str(tmp_path)}},
  )
  client.execute()  # raises CellExecutionError, with the cell, on any error

  outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
  pngs = [
      o["data"]["image/png"]
      for o in outputs
      if "image/png" in o.get("data", {})
  ]
  assert pngs, "the notebook made no plot"
  assert base64.b64decode(pngs[0])[:8] == b"\x89PNG\r\n\x1a\n"
  text = "".join(o.get("text", "") for o in outputs)
  assert "sandbox:" in text and "turn 1:" in text
  with open(workdir / "metrics.jsonl") as f:
    rows = [json.loads(line) for line in f]
  assert [r["step"] for r in rows] == [1, 2]
  assert all(0.0 <= r["designer/valid_rate"] <= 1.0 for r in rows)
