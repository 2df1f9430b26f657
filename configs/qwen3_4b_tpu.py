r"""Qwen3 4B on a Cloud TPU slice, from a Hugging Face checkpoint directory.

Launch on a v5p-32 slice (16 chips, 4 hosts) with XManager, the checkpoint
being the Hugging Face directory of Qwen/Qwen3-4B (config.json and
*.safetensors), copied to a bucket:

  python launch/xm_launch.py --config=configs/qwen3_4b_tpu.py \
      --tpu=v5p-32 --workdir=gs://BUCKET/spade/qwen3_4b \
      --config.checkpoint.path=/gcs/BUCKET/Qwen3-4B

Add `--dry_run` to print the job instead of launching it. The tiny CPU
variant (same family switches and mesh axes, 8 fake devices):

  python -m spade.main --config=configs/qwen3_4b_tpu.py:runlocal \
      --workdir=/tmp/qwen3_4b_runlocal

This file also holds the settings `qwen3_8b_tpu.py` uses, so the two sizes
cannot drift apart. Shapes come from `spade.model.transformer.qwen3_shapes`
(the Hugging Face configs: 4B ties its output layer to the embedding, 8B does
not); the loader checks them against the directory's config.json. Rollouts
follow the reference implementation, as in `gemma3_1b_tpu.py`.
"""

from spade import config as config_lib
from spade.model import transformer

# Parameter sharding per size: (fsdp, tensor). Float32 master weights and
# Adam moments take 16 bytes a parameter: 4B over 8 chips and 8B over 16 are
# 8 GB a chip before activations.
MESH = {"4b": (8, 1), "8b": (16, 1)}


def qwen3_tpu_config(size: str, arg: str | None = None):
  """Returns the pod config of Qwen3 `size`, or its tiny `runlocal` variant.

  Args:
    size: "4b" or "8b".
    arg: None or "" for the pod config; "runlocal" for the same settings with
      a tiny byte-level model, small rollouts and a 2x2 (fsdp x tensor) mesh,
      so it builds and steps on a CPU with 8 fake devices.

  Returns:
    A `ConfigDict` that passes `spade.config.validate`.
  """
  if size not in MESH:
    raise ValueError(f"unknown Qwen3 size {size!r}; one of {sorted(MESH)}")
  if arg not in (None, "", "runlocal"):
    raise ValueError(
        f"configs/qwen3_{size}_tpu.py has no variant {arg!r} (try 'runlocal')"
    )
  c = config_lib.base_config()
  c.num_iterations = 200

  m = c.model
  m.update(transformer.qwen3_shapes(size))
  m.max_len = 8192
  m.dtype = "bfloat16"
  # Float32 master weights: bfloat16 updates at lr ~1e-6 round to nothing.
  m.param_dtype = "float32"

  c.checkpoint.kind = "hf"
  c.checkpoint.path = ""  # the Hugging Face directory: --config.checkpoint.path
  c.tokenizer.kind = "qwen_bpe"

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
  # The update of the reference's rollout in micro-batches of 64 rows, each
  # layer recomputed in the backward pass (as the Gemma 3 pod configs).
  c.optim.microbatch_rows = 64
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
  """Qwen3 4B pod config; `arg="runlocal"` is its tiny CPU variant."""
  return qwen3_tpu_config("4b", arg)
