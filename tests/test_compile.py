"""`spade.compile`: the tiny config compiles for a v5p-8 slice from this CPU.

Needs libtpu (`pip install -e .[tpu]`, part of `launch/setup.sh dev`): its
topology description gives the slice's devices without any chips.
"""

import importlib.util
import os

import pytest

pytest.importorskip("libtpu", reason="needs jax[tpu]: pip install -e .[tpu]")

# pylint: disable=g-import-not-at-top,wrong-import-position
from spade import compile as compile_lib
from spade.model import topology

GIB = 1024**3
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tiny(**overrides):
  spec = importlib.util.spec_from_file_location(
      "tiny", os.path.join(ROOT, "configs", "tiny.py")
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config()
  # Short rows and prompts: the program is the same, the compile is quicker.
  c.model.max_len = 256
  c.agent.max_context = 64
  c.agent.max_new_tokens = 16
  c.designer.max_prompt_tokens = 64
  c.designer.max_new_tokens = 64
  c.compile.agent_len = 128
  for dotted, value in overrides.items():
    node = c
    *path, key = dotted.split("__")
    for part in path:
      node = node[part]
    node[key] = value
  return c


def test_tiny_config_compiles_and_fits_a_v5p_8():
  lines = []
  report = compile_lib.run(
      _tiny(), "v5p-8", config_name="tiny", log=lines.append
  )
  names = [p.name for p in report.programs]
  assert names == [
      "update",
      "agent prefill",
      "agent decode",
      "designer prefill",
      "designer decode",
  ]
  assert report.slice.chips == 4 and report.mesh_shape["data"] == 4
  hbm = topology.parse("v5p-8").hbm_gib * GIB
  for p in report.programs:
    assert p.fits, p
    assert p.argument_bytes > 0 and p.peak_bytes > 0, p
    assert p.peak_bytes < hbm
    assert p.model_flops > 0 and p.xla_flops > 0
    assert p.compile_s > 0
  update = report.programs[0]
  # The state (params + two Adam moments) is an argument and is donated.
  assert update.alias_bytes > 0
  assert update.shape.startswith("agent 16x128, designer 4x128")
  assert len(lines) == len(report.programs)
  summary = dict(kv.split("=", 1) for kv in report.summary().split())
  assert summary["fits"] == "True"
  assert summary["hbm_gib"] == "95"
  assert summary["topology"] == "v5p-8"
  assert 0 < float(summary["peak_gib_per_device"]) < 95


def test_an_absurd_batch_does_not_fit():
  # 4M tokens through a 16k-wide MLP without micro-batches or remat: the
  # saved activations alone are hundreds of GiB per chip.
  c = _tiny(
      model__embed_dim=4096,
      model__mlp_dim=16384,
      model__max_len=4096,
      compile__agent_rows=1024,
      compile__agent_len=4096,
  )
  report = compile_lib.run(c, "v5p-8", samplers=False, log=lambda _: None)
  (update,) = report.programs
  assert not report.fits and not update.fits
  # Either the compiler refuses (RESOURCE_EXHAUSTED) or its peak is over.
  assert update.error or update.peak_bytes > 95 * GIB
  assert "fits=False" in report.summary()


@pytest.mark.parametrize(
    "name, chips, kind",
    [
        ("v5p-32", 16, "TPU v5"),
        ("v4-8", 4, "TPU v4"),
        ("v5e-16", 16, "TPU v5 lite"),
        ("v6e-8", 8, "TPU v6 lite"),
    ],
)
def test_slice_names_give_the_slice_devices(name, chips, kind):
  devices = topology.parse(name).devices()
  assert len(devices) == chips
  assert {d.device_kind for d in devices} == {kind}
