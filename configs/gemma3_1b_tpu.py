r"""Gemma 3 1B on a Cloud TPU slice: reference-sized self-play iterations.

Launch on a v5p-32 slice (16 chips, 4 hosts) with XManager:

  python launch/xm_launch.py --config=configs/gemma3_1b_tpu.py \
      --tpu=v5p-32 --workdir=gs://BUCKET/spade/gemma3_1b \
      --config.checkpoint.path=/gcs/BUCKET/gemma-3-1b-it-Q8_0.gguf

Add `--dry_run` to print the job instead of launching it. On one host, or to
try the shape on CPU (8 fake devices, tiny model, same mesh axes):

  python -m spade.main --config=configs/gemma3_1b_tpu.py:runlocal \
      --workdir=/tmp/gemma3_1b_runlocal

This file also holds the pod settings that
`gemma3_4b_tpu.py`, `gemma3_12b_tpu.py` and `gemma3_27b_tpu.py` use, so the
four sizes cannot drift apart.

Mesh: parameters are sharded FSDP-style over `mesh.fsdp` devices and, for the
larger sizes, their heads and MLP over `mesh.tensor` devices; `mesh.data=-1`
takes every remaining device, so one file fits any slice whose chip count is
a multiple of `fsdp * tensor` (v4 and v5p expose one JAX device per chip).
Rollouts follow the reference implementation: 24 environments an iteration,
16 episodes with and 16 without a hint each, up to 25 turns.
"""

from spade import config as config_lib
from spade.model import transformer

# Parameter sharding per size: (fsdp, tensor). fsdp grows with the model so
# float32 params + Adam moments (16 bytes/param) stay a few GB per chip;
# tensor parallelism starts at 12B, where one layer's MLP no longer fits the
# per-chip budget comfortably. Smallest slice: fsdp * tensor chips.
MESH = {"1b": (4, 1), "4b": (8, 1), "12b": (16, 4), "27b": (16, 8)}


def gemma3_tpu_config(size: str, arg: str | None = None):
  """Returns the pod config of Gemma 3 `size`, or its tiny `runlocal` variant.

  Args:
    size: one of "1b", "4b", "12b", "27b".
    arg: None or "" for the pod config; "runlocal" for the same settings with
      a tiny byte-level model, small rollouts and a 2x2 (fsdp x tensor) mesh,
      so it builds and steps on a CPU with 8 fake devices.

  Returns:
    A `ConfigDict` that passes `spade.config.validate`.
  """
  if size not in MESH:
    raise ValueError(f"unknown Gemma 3 size {size!r}; one of {sorted(MESH)}")
  if arg not in (None, "", "runlocal"):
    raise ValueError(
        f"configs/gemma3_{size}_tpu.py has no variant {arg!r} (try 'runlocal')"
    )
  c = config_lib.base_config()
  c.num_iterations = 200

  m = c.model
  # The published shapes (spade.model.transformer's table): five local
  # layers then one global, linear RoPE scaling 8 on the global layers of
  # 4B and up.
  m.update(transformer.gemma3_shapes(size))
  m.max_len = 8192
  m.dtype = "bfloat16"
  # Float32 master weights: bfloat16 updates at lr ~1e-6 round to nothing.
  m.param_dtype = "float32"

  c.checkpoint.kind = "gemma3_gguf"
  c.checkpoint.path = ""  # give the GGUF file with --config.checkpoint.path
  c.tokenizer.kind = "gemma_sp"

  c.mesh.data = -1
  c.mesh.fsdp, c.mesh.tensor = MESH[size]

  c.sampling.temperature = 1.0
  c.sampling.top_p = 1.0

  # A TPU host has 100-200 vCPUs; gVisor sandboxes are cheap (~0.4 s start).
  c.sandbox.num_sandboxes = 16

  c.designer.num_envs = 24
  c.designer.max_new_tokens = 4096
  c.designer.max_prompt_tokens = 2048
  c.designer.use_seed_programs = False

  c.agent.episodes_per_env = 16
  c.agent.max_turns = 25
  c.agent.max_new_tokens = 512
  c.agent.max_context = 8192

  c.regret.estimator = "reference"
  c.optim.learning_rate = 1e-6
  # Without these the update of the reference's rollout (below) needs ~924
  # GiB of temporaries per v5p chip (`python -m spade.compile`): micro-batches
  # of 64 rows, each layer recomputed in the backward pass.
  c.optim.microbatch_rows = 64
  # The key is a policy name once layers are scanned, a bool before.
  m.remat = "full" if isinstance(m.remat, str) else True
  c.optim.kl_coef = 0.0
  c.optim.designer_delay = 4  # the reference waits 4 or 8 iterations

  # `spade.compile` checks the update at the reference's rollout size: 1024
  # agent turns of up to 4096 tokens, 32 designs of up to 6144.
  c.compile.agent_rows = 1024
  c.compile.agent_len = 4096
  c.compile.designer_rows = 32
  c.compile.designer_len = 6144

  c.train.checkpoint_every = 5
  c.train.keep_checkpoints = 3
  c.memory.replay_fraction = 0.25

  if arg == "runlocal":
    _shrink_for_cpu(c)
  return c


def _shrink_for_cpu(c) -> None:
  """Tiny byte model and rollouts; keeps the family switches and mesh axes."""
  c.num_iterations = 1
  m = c.model
  m.vocab_size = 256 + 3
  m.num_layers = 2
  m.embed_dim = 64
  m.num_heads = 4
  m.num_kv_heads = 2
  m.head_dim = 16
  m.mlp_dim = 128
  m.sliding_window = 16
  m.global_every = 2  # one local and one global layer, like the real stack
  m.query_scale = 0.0
  m.max_len = 512
  m.dtype = "float32"
  c.checkpoint.kind = "scratch"
  c.checkpoint.path = ""
  c.tokenizer.kind = "bytes"
  c.mesh.fsdp, c.mesh.tensor = 2, 2
  c.sandbox.num_sandboxes = 1
  c.designer.num_envs = 2
  c.designer.max_new_tokens = 32
  c.designer.max_prompt_tokens = 256
  c.designer.use_seed_programs = True
  c.agent.episodes_per_env = 1
  c.agent.max_turns = 2
  c.agent.max_new_tokens = 8
  c.agent.max_context = 384
  c.optim.designer_delay = 0
  c.optim.microbatch_rows = 0
  c.compile.agent_rows = c.compile.agent_len = 0
  c.compile.designer_rows = c.compile.designer_len = 0
  c.train.checkpoint_every = 1


def get_config(arg=None):
  """Gemma 3 1B pod config; `arg="runlocal"` is its tiny CPU variant."""
  return gemma3_tpu_config("1b", arg)
