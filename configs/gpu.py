r"""The pod configs on NVIDIA GPUs: one node of 8 x 80 GB, or one 141 GB GPU.

The argument is "MODEL,NODE" (optionally ",runlocal"): MODEL one of
`MODELS` (the TPU configs' models: `gemma3_1b` ... `gemma3_27b`,
`qwen3_4b`, `qwen3_8b`), NODE `8x80gb` (one node of eight A100/H100 80 GB,
the reference's training node) or `1x141gb` (one H200). Install the CUDA
wheels first (`pip install -e .[cuda]`), then on the node:

  python -m spade.main --config=configs/gpu.py:qwen3_4b,8x80gb \
      --workdir=/tmp/spade_qwen3_4b --config.checkpoint.path=/data/Qwen3-4B
  python -m spade.main --config=configs/gpu.py:gemma3_1b,1x141gb \
      --workdir=/tmp/spade_gemma3_1b \
      --config.checkpoint.path=/data/gemma-3-1b-it-Q8_0.gguf

`runlocal` keeps a node's settings with the tiny byte model on a CPU with 8
fake devices (`python -m spade.main --config=configs/gpu.py:qwen3_4b,8x80gb,
runlocal --workdir=/tmp/gpu_runlocal`). `benchmarks/device.sh` measures
sampling, rollouts and the update on a GPU.

Each is the TPU config of its model (`spade.config.tpu_pod_config`: the
reference's rollouts, 24 environments x (16 + 16) episodes of up to 25
turns) with the mesh and the sizes that decide memory set for the node:

* 8 x 80 GB: parameters and Adam moments sharded over the 8 GPUs
  (`mesh.fsdp=8`), the slot engine's 128 slots of 8,192 tokens (Qwen3 8B:
  36 layers x 8 KV heads x 128 x 2 x 2 bytes = 144 KiB a token, 18 GiB of
  cache a GPU). Up to 12B train in full (12B: 24 GB of state a GPU); 27B trains LoRA
  adapters (`optim.lora_rank=64`: its 432 GB of full train state would
  leave no room for the caches).
* 1 x 141 GB: one device. Up to 4B train in full (64 GB of state for 4B,
  36 GiB for 32 slots' caches); 8B trains LoRA adapters; 12B and 27B are
  refused. 16-row micro-batches in the update.

These sizes are worked out from the shapes, not measured: no GPU has run
them yet (`spade.compile` checks TPU slices only).
"""

import importlib.util
import os

_FILE = "configs/gpu.py"
_DIR = os.path.dirname(os.path.abspath(__file__))

# model -> (TPU config file, its argument)
MODELS = {
    "gemma3_1b": ("gemma3_tpu.py", "1b"),
    "gemma3_4b": ("gemma3_tpu.py", "4b"),
    "gemma3_12b": ("gemma3_tpu.py", "12b"),
    "gemma3_27b": ("gemma3_tpu.py", "27b"),
    "qwen3_4b": ("qwen3_4b_tpu.py", None),
    "qwen3_8b": ("qwen3_8b_tpu.py", None),
}
NODES = ("8x80gb", "1x141gb")
# LoRA ranks (0: full training) where 16 bytes a parameter of train state
# would not leave room for the slot caches: on one 8 x 80 GB node, and on
# one 141 GB GPU (the models it holds at all).
_NODE_LORA = {"gemma3_27b": 64}
_SINGLE = {
    "gemma3_1b": 0,
    "gemma3_4b": 0,
    "qwen3_4b": 0,
    "qwen3_8b": 64,
}


def _tpu_config(model: str, runlocal: bool):
  name, arg = MODELS[model]
  spec = importlib.util.spec_from_file_location(
      name[:-3], os.path.join(_DIR, name)
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if runlocal:
    arg = f"{arg},runlocal" if arg else "runlocal"
  return module.get_config(arg)


def get_config(arg=None):
  """The GPU config of one model on one node; see the module docstring.

  Args:
    arg: "MODEL,NODE" or "MODEL,NODE,runlocal"; None or "" is
      "qwen3_4b,8x80gb".

  Returns:
    A `ConfigDict` that passes `spade.config.validate`.
  """
  parts = (arg or "qwen3_4b,8x80gb").split(",")
  model, node = (parts + [""])[:2]
  runlocal = parts[2:] == ["runlocal"]
  if (
      model not in MODELS
      or node not in NODES
      or parts[2:] not in ([], ["runlocal"])
  ):
    raise ValueError(
        f"{_FILE} has no variant {arg!r}: give MODEL,NODE[,runlocal] with"
        f" MODEL one of {sorted(MODELS)} and NODE one of {list(NODES)}"
    )
  if node == "1x141gb" and model not in _SINGLE:
    raise ValueError(
        f"{model} does not fit one 141 GB GPU (16 bytes a parameter of train"
        f" state); use {model},8x80gb, or one of {sorted(_SINGLE)}"
    )
  c = _tpu_config(model, runlocal)
  c.mesh.data = -1
  if node == "8x80gb":
    c.mesh.fsdp, c.mesh.tensor = 8, 1
    c.sampling.slots = 128
    c.sampling.prefill_rows = 8
    c.optim.lora_rank = _NODE_LORA.get(model, 0)
  else:
    c.mesh.fsdp = c.mesh.tensor = 1
    c.sampling.slots = 32
    c.sampling.prefill_rows = 4
    c.optim.microbatch_rows = 16
    c.optim.lora_rank = _SINGLE[model]
  # A GPU host has fewer cores than a TPU host's 100-200.
  c.sandbox.num_sandboxes = 8
  # The 12B's and 27B's TPU configs pad the MLP's rows to the TPU's 128
  # lanes (`layers.padded_rows`), a TPU layout's fix, unmeasured on GPU.
  c.model.decode_mlp_pad_rows = 0
  # The MLP as XLA's matmuls (`spade.model.fused_mlp` is a TPU kernel).
  c.model.decode_mlp_kernel = "xla"
  # And keep the residual stream as training does (`layers.residual`;
  # measured on TPU only).
  c.mesh.rules = tuple(
      (name, None if name == "decode_residual" else target)
      for name, target in c.mesh.rules
  )
  if runlocal:
    # The tiny model on 8 fake CPU devices (batch shards: 8).
    c.mesh.fsdp = min(c.mesh.fsdp, 4)
    c.sampling.slots = c.sampling.prefill_rows = 8
    c.sampling.decode_steps = 8
    c.optim.microbatch_rows = 0
  return c
