"""`spade.model.fused_mlp`: a one-token step's MLP as one Pallas TPU kernel
that gathers its input and its hidden over fsdp by remote DMAs into VMEM.

On CPU it runs in Pallas' TPU interpreter ("interpret"), on 4 of the 8 fake
devices (the interpreter runs every device's kernel at once, and 8 blocking
at its barrier hang this 2-core machine's host pool). For a TPU slice it is
compiled (Mosaic) from this CPU, and `spade.hlo_bytes` counts its bytes.
"""

import functools
import os
import re

import jax
from jax._src.pallas.mosaic.interpret import interpret_pallas_call as interpreter
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from spade import config as config_lib
from spade import hlo_bytes
from spade.model import architecture
from spade.model import fused_mlp
from spade.model import sharding
from spade.model import topology
from tests.model import steps

P = jax.sharding.PartitionSpec


def _pod_rules():
  pod = config_lib.tpu_pod_config(
      {}, fsdp=2, tensor=2, checkpoint_kind="none", tokenizer_kind="bytes",
      variant="", config_file="test",
  )  # fmt: skip
  assert pod.model.decode_mlp_kernel == "pallas"
  return pod.mesh.rules


def _mesh(devices=None):
  mesh = ml_collections.ConfigDict(dict(data=1, fsdp=2, tensor=2))
  return sharding.make_mesh(mesh, devices)


def _step(cfg, rules, rows=8):
  """(one device's logits, the pod rules' on a 1x2x2 mesh of 4 devices,
  that program's jaxpr text) for a one-token step on `rows` rows."""
  mesh = _mesh(jax.devices()[:4])
  return steps.one_token_step(cfg, rules, mesh, rows, text="jaxpr")


def test_the_kernel_gives_the_matmuls_logits_in_the_interpreter():
  """Under a tensor-axis pod config's rules a one-token step on 8 rows
  (its residual kept) runs its MLP as the kernel in every layer with
  `decode_mlp_kernel="interpret"`, and its logits equal one device's and
  those of the XLA matmuls; "pallas" off a TPU runs the matmuls. It runs
  on fewer rows than half of `decode_mlp_pad_rows` too."""
  rules = _pod_rules()
  cfg = config_lib.base_config().model
  cfg.num_layers, cfg.mlp_dim = 2, 96
  cfg.decode_mlp_kernel = "interpret"
  single, fused, text = _step(cfg, rules)
  assert len(re.findall(r"name=fused_mlp", text)) == cfg.num_layers
  np.testing.assert_allclose(fused, single, atol=1e-5)
  cfg.decode_mlp_kernel = "pallas"
  _, xla, text = _step(cfg, rules)
  assert "fused_mlp" not in text
  np.testing.assert_allclose(fused, xla, atol=1e-5)
  # Fewer rows than half of `decode_mlp_pad_rows`: the residual is kept
  # (`layers.residual_kept`) and the kernel runs there too.
  cfg.decode_mlp_kernel, cfg.decode_mlp_pad_rows = "interpret", 32
  _, few, text = _step(cfg, rules)
  assert len(re.findall(r"name=fused_mlp", text)) == cfg.num_layers
  np.testing.assert_allclose(few, single, atol=1e-5)


def test_gelu_and_silu_kernels_round_as_the_matmuls_do():
  """bfloat16 activations: the kernel's output equals the XLA path's (gate
  and up rounded to bfloat16, act(gate) * up in float32, the hidden and
  down's partial sums rounded to bfloat16) to bfloat16's rounding, for both
  activations, and stays where the residual is (its width over fsdp); the
  interpreter's race detector finds no race in its DMAs."""
  mesh = _mesh(jax.devices()[:4])
  rules = _pod_rules()
  keys = jax.random.split(jax.random.key(2), 4)
  x = jax.random.normal(keys[0], (16, 64), jnp.float32)
  gate = jax.random.normal(keys[1], (64, 96)) * 0.2
  up = jax.random.normal(keys[2], (64, 96)) * 0.2
  down = jax.random.normal(keys[3], (96, 64)) * 0.2
  b = jnp.bfloat16
  for activation in ("gelu", "silu"):
    cfg = architecture.ModelConfig.from_config({
        "embed_dim": 64, "mlp_dim": 96, "dtype": "bfloat16",
        "mlp_activation": activation, "decode_mlp_kernel": "interpret",
    })  # fmt: skip
    with sharding.use_rules(mesh, rules):
      out = jax.jit(functools.partial(fused_mlp.mlp, cfg))(x, gate, up, down)
    assert out.sharding.spec[-1] == "fsdp"
    g = jnp.dot(x.astype(b), gate.astype(b), preferred_element_type=jnp.float32)
    u = jnp.dot(x.astype(b), up.astype(b), preferred_element_type=jnp.float32)
    g, u = g.astype(b).astype(jnp.float32), u.astype(b).astype(jnp.float32)
    act = (
        jax.nn.gelu(g, approximate=True)
        if activation == "gelu"
        else jax.nn.silu(g)
    )
    hidden = (act * u).astype(b)
    want = np.asarray(
        jnp.dot(hidden, down.astype(b), preferred_element_type=jnp.float32)
    )
    got = np.asarray(out, np.float32)
    np.testing.assert_allclose(got, want, atol=np.abs(want).max() * 2**-7)
    # No chip read a buffer a DMA was still writing, or wrote one still
    # being sent (the interpreter's race detector, `fused_mlp._INTERPRET`;
    # a kernel whose receivers skip their waits trips it).
    assert interpreter.races is not None and not interpreter.races.races_found


def test_the_kernel_compiles_for_a_tpu_and_its_bytes_are_counted():
  """Mosaic compiles the kernel for a v5p-8 (4 chips, 1x2x2) from this CPU:
  the program has one `tpu_custom_call`, whose attributes run over several
  lines of the HLO text, and `spade.hlo_bytes` counts the partial sums it
  writes and parses the ops after it."""
  mesh = _mesh(topology.parse("v5p-8").devices())
  rules = _pod_rules()
  cfg = architecture.ModelConfig.from_config({
      "embed_dim": 256, "mlp_dim": 1024, "dtype": "bfloat16",
      "decode_mlp_kernel": "pallas",
  })  # fmt: skip
  s = lambda *spec: jax.sharding.NamedSharding(mesh, P(*spec))
  args = (
      jax.ShapeDtypeStruct((128, 256), jnp.bfloat16, sharding=s(None, "fsdp")),
      jax.ShapeDtypeStruct((256, 1024), jnp.bfloat16, sharding=s(None, ("tensor", "fsdp"))),
      jax.ShapeDtypeStruct((256, 1024), jnp.bfloat16, sharding=s(None, ("tensor", "fsdp"))),
      jax.ShapeDtypeStruct((1024, 256), jnp.bfloat16, sharding=s("tensor", "fsdp")),
  )  # fmt: skip
  with sharding.use_rules(mesh, rules):
    compiled = (
        jax.jit(lambda *a: fused_mlp.mlp(cfg, *a) * 2).lower(*args).compile()
    )
  text = compiled.as_text()
  assert text.count('custom_call_target="tpu_custom_call"') == 1
  comps, entry = hlo_bytes.parse(text)
  ops = comps[entry]
  (at,) = [i for i, op in enumerate(ops) if op.opcode == "custom-call"]
  # The ops after the call are parsed (the root, * 2, among them).
  assert ops[-1].root and len(ops) > at + 1, [op.name for op in ops]
  split = hlo_bytes.breakdown_text(text, 0.0)
  out = 128 * 256 // 2 * 2  # a chip's partial sums, [128, 128] bf16
  counted = [b for b, _, label in split.top if "custom-call" in label]
  assert counted and counted[0] >= out, split.top


@pytest.mark.parametrize("size, kernel", [("4b", "xla"), ("12b", "pallas")])
def test_the_tensor_axis_pod_configs_run_the_kernel(size, kernel):
  root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
  c = config_lib.load_file(f"configs/gemma3_tpu.py:{size}", root)
  assert c.model.decode_mlp_kernel == kernel


def test_decode_mlp_kernel_names_a_kernel():
  with pytest.raises(ValueError, match="decode_mlp_kernel"):
    architecture.ModelConfig.from_config({"decode_mlp_kernel": "mosaic"})
