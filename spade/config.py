"""The config tree every SPADE experiment shares, and its validation.

Config files under `configs/` start from `base_config()` and change what they
need; `validate()` runs before anything heavy so a bad override is one line
that names the key, not a traceback an hour into a run.

Sections (each owned by the package of the same name):

  model       sizes and family switches of the shared decoder
  checkpoint  where the initial weights come from
  tokenizer   bytes / gemma SentencePiece / qwen byte-level BPE
  mesh        device mesh shape and the logical-axis rule table
  sampling    defaults for the compiled sampler
  sandbox     backend and pool of the environment sandboxes
  environments  properties a valid environment program must have
  designer    environment designer: prompts, sampling, validation
  agent       rollouts: episodes with and without hint, turns
  regret      estimator and designer reward
  optim       the shared update (GRPO/PPO clipping, KL, delays)
  train       loop length, checkpoints, warm start, baseline mode
  difficulty  the sliding-window level controller of the adaptive mode
  memory      environment archive, duplicates, replay
  grounding   document sources for the designer
  eval        held-out suites run in-loop
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any, Callable, NoReturn

import ml_collections

from spade.regret import delayed
from spade.regret import estimators
from spade.train import modes

ConfigDict = ml_collections.ConfigDict


def base_config() -> ConfigDict:
  """Returns the full default config; files under `configs/` override it."""
  c = ConfigDict()
  c.seed = 0
  c.num_iterations = 2

  c.model = ConfigDict()
  c.model.family = "gemma3"  # "gemma3" | "qwen2" | "qwen3"
  c.model.vocab_size = 256 + 3  # bytes + pad/bos/eos
  c.model.embed_dim = 64
  c.model.num_layers = 2
  c.model.num_heads = 4
  c.model.num_kv_heads = 2
  c.model.head_dim = 16
  c.model.mlp_dim = 128
  c.model.sliding_window = 0  # 0: every layer global
  c.model.global_every = 6  # every Nth layer is global (Gemma 3: 6)
  c.model.rope_local_base = 10_000.0
  c.model.rope_global_base = 1_000_000.0
  # Linear RoPE scaling of the global layers (frequencies divided by it);
  # Gemma 3 4B, 12B and 27B use 8, as their Hugging Face configs say.
  c.model.rope_global_scale = 1.0
  c.model.query_scale = 0.0  # 0: 1/sqrt(head_dim)
  c.model.qk_norm = True
  c.model.qkv_bias = False
  c.model.mlp_activation = "gelu"  # "gelu" (GeGLU) | "silu" (SwiGLU)
  c.model.tie_embeddings = True
  c.model.scale_embeddings = True  # Gemma multiplies by sqrt(embed_dim)
  c.model.norm_eps = 1e-6
  c.model.max_len = 1024
  c.model.dtype = "float32"
  c.model.param_dtype = "float32"
  # What the update's backward keeps of each layer (the rest is recomputed):
  # "none" (keep all), "full" (only each layer's input), "minimal" (the
  # weight matmuls' outputs), "save_dot_except_mlp", ...: MaxText's names,
  # spade.model.architecture.REMAT_POLICIES.
  c.model.remat = "none"
  # Decoding runs the layers one by one on an unstacked copy of their weights
  # made once per sampler call (fast: 4x on CPU for Gemma 3 270M at batch 8);
  # True decodes through the scanned stacks instead, with no second copy of
  # the layer weights during sampling (for a model that barely fits).
  c.model.scan_decode = False
  # How a one-token step (decoding) partitions its matmuls over the mesh:
  # "stationary" keeps each weight on its shards and moves the rows to them
  # (a step reads each chip's shard once, docs/scale.md); "fsdp" all-gathers
  # every weight each step, as training does. The same program on one device.
  c.model.decode_sharding = "stationary"
  # How projection kernels are stored: "in_out" ([in, out]) or "out_in"
  # ([out, in], the files' own layout), which XLA's CPU backend streams
  # faster in a matmul of a few rows (a 1.5B decode step at 4 and 8 rows:
  # 1.12x and 1.19x); the same weights, results equal up to the matmul's
  # summation order (greedy tokens equal). The Qwen CPU configs take
  # "out_in" (benchmarks/README.md).
  c.model.kernel_layout = "in_out"
  # Whole-sequence forwards (the update) attend this many queries at a time,
  # each block rematerialised, so the backward keeps [chunk, L] attention
  # scores instead of [L, L]; same results. 0: one block (the reference's);
  # a length that is not a multiple of the chunk also runs as one block.
  c.model.attention_chunk = 0
  # The KV cache's keys and values: "" in `dtype`; "int8" with one float32
  # scale per row, KV head and position (half a bfloat16 cache's bytes and
  # a decode step reads mostly cache: docs/scale.md). Off by default: it
  # changes the attention's values by the rounding (benchmarks/README.md).
  c.model.kv_cache_dtype = ""
  # A one-token step's MLP pads its rows to a multiple of this when its
  # input gathers them (the mesh splits them, or the residual is kept in the
  # decoding layout, rule "decode_residual") and there are at least half of
  # it (`layers.padded_rows`); 0: never. The tensor-axis pod configs set 128
  # (the TPU's lanes).
  c.model.decode_mlp_pad_rows = 0
  # How such a step runs its MLP where its residual is kept in the decoding
  # layout: "xla" (matmuls on the input XLA gathers), "pallas"
  # (`spade.model.fused_mlp`: one TPU kernel that gathers the input and the
  # hidden into VMEM, XLA's matmuls off a TPU) or "interpret" (that kernel
  # in Pallas' interpreter, any backend). The tensor-axis pod configs set
  # "pallas".
  c.model.decode_mlp_kernel = "xla"
  # False: one output layer, heads/shared/unembedding, for both roles (the
  # reference's one model); True: one per role, heads/designer/unembedding
  # and heads/agent/unembedding (ours).
  c.model.separate_heads = False

  c.checkpoint = ConfigDict()
  # "scratch" | "gemma3_gguf" | "qwen2_gguf" | "hf": a Hugging Face directory
  # (config.json + *.safetensors) at checkpoint.path.
  c.checkpoint.kind = "scratch"
  c.checkpoint.path = ""  # empty: found automatically for the GGUF kinds
  # qwen2_gguf's file when path is empty: "0.5b" or "1.5b"
  # (Qwen2.5-Coder-Instruct, `spade.model.gguf_files.QWEN2P5_CODER`).
  c.checkpoint.size = "0.5b"
  # GGUF kinds: keep a converted orbax copy in the cache dir ($SPADE_CACHE or
  # ~/.cache/spade) so later starts skip the dequantization.
  c.checkpoint.cache = True

  c.tokenizer = ConfigDict()
  c.tokenizer.kind = "bytes"  # "bytes" | "gemma_sp" | "qwen_bpe"

  c.mesh = ConfigDict()
  c.mesh.data = -1  # -1: all devices not used by the other axes
  c.mesh.fsdp = 1
  c.mesh.tensor = 1
  # Logical axis -> mesh axis (or None). A short table, as in t5x.
  c.mesh.rules = (
      ("batch", ("data", "fsdp")),
      # A one-token step's rows where they meet a weight's shards
      # (`model.decode_sharding="stationary"`): whole on every fsdp shard.
      ("decode_batch", "data"),
      # The decoding layout's tables, by rows (`layers.DECODE_PARAM_AXES`),
      # and a decode step's logits: split over the vocabulary.
      ("decode_vocab", ("fsdp", "tensor")),
      # And the MLP's hidden width in that layout: gate and up's, and down's
      # with its output width (`layers.DECODE_PARAM_AXES`).
      ("decode_mlp", ("fsdp", "tensor")),
      ("decode_down", ("fsdp", "tensor")),
      ("decode_embed", None),
      # And a one-token step's residual stream between the layers: None
      # keeps it as training does (rows over "batch", the width whole); a
      # mesh axis keeps its rows whole and its width split there
      # (`layers.residual`).
      ("decode_residual", None),
      ("vocab", "tensor"),
      ("embed", "fsdp"),
      ("heads", "tensor"),
      ("kv_heads", None),
      # The KV cache's heads (`kv_cache.CACHE_AXES`) and the attention over
      # it, where they divide the tensor axis: a chip reads its own heads.
      ("cache_heads", "tensor"),
      ("head_dim", None),
      ("mlp", "tensor"),
      ("length", None),
      ("layers", None),
  )

  c.sampling = ConfigDict()
  # Prompt columns the sampler writes into the KV cache per prefill step:
  # the step's attention scores are rows x heads x this x cache length.
  c.sampling.prefill_chunk = 512
  # Every role samples through the slot engine (`spade.sampling.slot_server`:
  # decode slots refilled as rows end; the rollout's episodes are requests of
  # their own, and so are the designer's and hint writer's prompts).
  # The slot engine's sizes: decode slots (its compiled batch; each slot
  # holds a cache of model.max_len), prompts one prefill-insert writes, and
  # tokens per generate call (the host refills slots between calls). Each
  # is rounded up to a multiple of the mesh's batch shards.
  c.sampling.slots = 16
  c.sampling.prefill_rows = 4
  c.sampling.decode_steps = 16
  # A generate call runs on the live slots gathered into the smallest of
  # min_rows, 3/2 x, 2 x, 3 x, ... rows (then all slots) that holds them:
  # idle slots cost no decode steps (0: every slot, every call). Each row
  # count compiles once per cache window used.
  c.sampling.min_rows = 4
  # No gathered count above this (0: no cap; a call that needs more runs on
  # every slot): on a TPU slice, gathering many rows can read more a step
  # than every slot (`spade.compile --engine --bytes_breakdown` prints
  # `<role>_gather_pays_up_to=`).
  c.sampling.max_gathered_rows = 0
  # A gathered call on the whole cache with at least this many rows a shard
  # puts back only the slots its steps wrote, fewer their rows whole
  # (compiled for v5p, 2-4 rows a chip read more with the steps-only put;
  # from 6 every count read less: docs/scale.md). `spade.compile --engine`
  # measures another value on another slice.
  c.sampling.put_steps_from = 6
  # A gathered call on the whole cache runs on the live slots where they
  # lie (moved to the front of their shards first), reading and writing
  # their cache in place instead of taking it out and putting it back:
  # "auto" on TPU (where XLA fuses the rows' slice into the attention; on
  # v5p it reads less at every count: docs/scale.md), not on CPU (there it
  # copies the rows every step: twice the time), "on" or "off" anywhere.
  c.sampling.in_place = "auto"

  c.sandbox = ConfigDict()
  c.sandbox.backend = "gvisor"  # "gvisor" | "bwrap" | "none"
  c.sandbox.num_sandboxes = 2
  # Limits on program code (spade.environments.budget.BUDGETS): "reference"
  # (spade/core/orchestrator.py: 30 s to load and reset a program and for
  # one step() in play, ENV_STEP_TIMEOUT; 60 s to validate it,
  # VALIDATE_GAME_TIMEOUT; no output cap at validation beyond what
  # agent.max_context holds) or "strict" (ours: 0.5 s of CPU a call, 5 s to
  # load, a 30 s validation, 65,536 characters a call). The three keys
  # below, when > 0, replace the named value.
  c.sandbox.budgets = "reference"
  # Loading a program (its module-level code) in play.
  c.sandbox.step_timeout_s = 0.0
  # One program call (reset, step, a tool, ...): past it, a call makes the
  # program invalid at validation ("call_timeout") and ends its episode in
  # play.
  c.sandbox.call_timeout_s = 0.0
  # The hard deadline of one validation (the validator's own budget is 0.8
  # of it: 60 s under "reference").
  c.sandbox.validate_timeout_s = 0.0
  # In play, a call returning more than this (JSON bytes) ends its episode
  # ("output_too_large"): a 32,768-token context's worth of ASCII at 8
  # characters a token, more than any context here holds.
  c.sandbox.call_output_cap_bytes = 256 << 10
  c.sandbox.memory_mb = 1024
  c.sandbox.host_grace_s = 5.0  # host deadline = worker deadline + this
  c.sandbox.max_envs_per_sandbox = 1000  # recycle after this many children
  c.sandbox.max_age_s = 3600.0  # ... or this age
  c.sandbox.max_host_tasks = 2000  # ... or this many host threads/stubs
  c.sandbox.warm_spare = True  # a sandbox started ahead for swaps
  # Imported once per worker before forking (~0.5 s and ~3 s in gVisor).
  c.sandbox.preload = ("numpy", "math_verify")
  c.sandbox.tmpfs_mb = 64
  c.sandbox.sandbox_memory_mb = 8192  # cgroup limit of one whole sandbox
  c.sandbox.nproc = 32  # processes per environment uid (fork bombs)
  c.sandbox.max_parallel = 16  # children a worker runs at once
  # Program processes each worker forks ahead, between requests: a fork
  # costs ~100 ms under gVisor, and a program's first episode then only
  # loads it (its later episodes are instances in the same process).
  c.sandbox.spare_envs = 4
  c.sandbox.runsc_path = ""  # empty: runsc from PATH

  # What a valid environment program must have beyond what the reference
  # accepts: names from spade.environments.contract.PROPERTIES, e.g.
  # ("deterministic", "solution_replayed") (ours, stricter); () accepts what
  # the reference's validate_game accepts (the reference).
  c.environments = ConfigDict()
  c.environments.require = ()
  # The reference's reset gate (criteria_throw_at_reset, on where a recipe
  # sets SPADE_RESET_GATE=1: its tool-use one): refuse a program whose
  # success criteria (self._message_criteria) raise on the state reset()
  # builds at seeds 0, 1 and 2. False: off, as in its games recipe.
  c.environments.reset_gate = False
  # True (the reference's _hung_game_blacklist): a program whose play hung
  # (an environment call past its budget) is not played again in the run;
  # False: played again (ours before).
  c.environments.blacklist_hung = True

  c.designer = ConfigDict()
  c.designer.num_envs = 2
  c.designer.samples_per_prompt = 2  # designs per grounding document (group)
  c.designer.max_new_tokens = 256
  # Each role samples with the reference's own settings: designs at its
  # games recipe's --spade-env-temperature 0.6 with --spade-env-top-p 0.95
  # and --spade-env-top-k 20 (spade/slime/arguments.py defaults, which the
  # recipe keeps); top_k 0 keeps every token, top_p 1.0 the whole mass.
  c.designer.temperature = 0.6
  c.designer.top_k = 20
  c.designer.top_p = 0.95
  # A design that (nearly) duplicates an archived program
  # (memory.duplicate_threshold): "play" (the reference, which has no
  # duplicate filter: played and trained like any design; the archive keeps
  # the first copy) or "refuse" (ours: invalid, reason "duplicate", so the
  # designer is pushed to new programs).
  c.designer.duplicates = "play"
  c.designer.hint_temperature = 0.3
  # The hint writer (SelfHintGenerator) passes only a temperature, so the
  # slime adapter's generate_async default top_p=0.9 applies and top-k is
  # slime's --rollout-top-k, which the recipe leaves unset (no top-k)
  # (spade/slime/model_adapter.py). The solvability audit (designer.audit)
  # samples the same way.
  c.designer.hint_top_k = 0
  c.designer.hint_top_p = 0.9
  # The reference's hint pass writes up to 4096 tokens (the games recipe's
  # --spade-hint-max-tokens); small configs lower it.
  c.designer.hint_max_new_tokens = 4096
  # How a written hint is read: "reference" keeps the whole reply (JSON
  # unwrapped, `hint_generator._parse_hint`); "first_paragraph" (ours) keeps
  # its first paragraph, at most 600 characters.
  c.designer.hint_parse = "reference"
  # "writer": hints written in a separate pass from the code under rules
  # against leaking the answer (the reference); "program": the program's own
  # hint(), which the designer prompt then asks for (ours).
  c.designer.hint_source = "writer"
  c.designer.max_prompt_tokens = 512
  # A budget too small for the designer's instructions: "refuse" (a config
  # error at start naming the keys: a prompt cut from the left starts
  # mid-sentence, without its task) or "cut_left" (ours, for tiny models
  # whose budget keeps only the instructions' tail).
  c.designer.prompt_overflow = "refuse"
  # Samples per design before it counts as invalid: the reference draws an
  # invalid design afresh from its prompt up to 5 times (the slime rollout
  # passes max_attempts=5 to collect_trajectories, spade/slime/
  # spade_rollout.py; generate_games_async's own default of 8 is unused
  # there) and keeps the first valid one; 1: no retry.
  c.designer.max_attempts = 5
  # The reference's model-based solvability audit (--spade-use-env-validator
  # with env_validator_model="self", core/env_validator.py): each valid
  # program's code goes to the designer role with the game type's audit
  # prompt; a \\boxed{no} refuses it (sampled again). On in its tool-use
  # recipe only; temperature and tokens are its env_validator_* defaults.
  c.designer.audit = False
  c.designer.audit_temperature = 0.3
  c.designer.audit_max_new_tokens = 16384
  # How the program is cut out of a designer sample
  # (`spade.designer.extract.extract_code`): "reference" (the first
  # ```python block, else the whole sample, then repair_fstring_braces,
  # spade/core/utils/parsing.extract_game_code) or "longest_class" (ours:
  # the longest fenced block that defines a class, no repair).
  c.designer.code_extraction = "reference"
  # A design sampled again after an invalid attempt gets a fresh grounding
  # document (the reference's corpus_orchestrator draws one per attempt);
  # False keeps the first attempt's prompt (ours).
  c.designer.fresh_document_per_attempt = True
  # ... and the memory's examples retrieved again (the reference's
  # orchestrator augments every attempt's prompt anew); False keeps the first
  # attempt's (ours).
  c.designer.fresh_examples_per_attempt = True
  # Designs still invalid after their attempts: "drop" (the reference: no
  # trajectory, out of the skill's centring) or "penalize" (ours: a row
  # with regret.invalid_penalty in its group, so the designer is pushed
  # away from what fails).
  c.designer.invalid_designs = "drop"
  # Iterations per regeneration epoch: the active skill window moves once an
  # epoch (the reference regenerates its pool every 4 rollouts).
  c.designer.regeneration_interval = 4
  c.designer.use_seed_programs = True  # tiny: fall back to seed programs
  # An iteration inside an open window (not a regeneration) whose pool
  # holds fewer environments than designer.num_envs: True (the reference's
  # collect_trajectories, Stage 2, spade/core/orchestrator.py lines
  # 2299-2326: `len(game_files) < min_games` generates the missing ones and
  # plays them from that rollout on) designs the missing number with the
  # same design phase; they are played unhinted to the window's end and
  # their designer rows get the reference's reward for them (the timeout
  # penalty or 0, centred among that iteration's top-ups; score.top_up_
  # samples). False: the pool stays as regenerated (ours before).
  c.designer.top_up = True
  # What the single-turn and corpus-grounded prompts show: "skeleton" (the
  # reference's interface skeleton with `...` bodies, spade/core/prompts/
  # corpus_template.py), "skeleton_max_turns" (ours: the same skeleton with
  # an __init__ that sets self.max_turns and self.turn_count, which its
  # step() reads) or "complete" (ours: also a complete example program,
  # spade.designer.examples). The multi-turn and tool-use prompts show the
  # reference's complete example either way.
  c.designer.prompt_example = "skeleton"
  # Prompt family (spade.designer.skills.FAMILIES); a grounding document
  # turns a game family into "corpus_game", as the reference's corpus
  # orchestrator does. The games recipe's: multi-turn games.
  c.designer.prompt_family = "multi_turn_game"
  # Skills prompts are conditioned on, cycled per prompt; the games recipe's
  # six, `skills_per_regen` of them active per regeneration epoch.
  c.designer.skills = (
      "Mathematical Reasoning",
      "Logical Deduction",
      "Spatial Reasoning",
      "Pattern Recognition",
      "Optimization",
      "Causal Inference",
  )
  c.designer.tool_use_skills = ("API Orchestration", "Data Retrieval")
  c.designer.skills_per_regen = 3
  c.designer.difficulties = ("medium",)  # each of "easy", "medium", "hard"

  c.agent = ConfigDict()
  c.agent.episodes_per_env = 2  # K, with and K without hint
  c.agent.max_turns = 3  # T
  c.agent.max_new_tokens = 32
  c.agent.max_context = 768
  # The games recipe's --spade-actor-temperature 0.6, with the defaults of
  # --spade-actor-top-p 0.95 and --spade-actor-top-k 20.
  c.agent.temperature = 0.6
  c.agent.top_k = 20
  c.agent.top_p = 0.95
  # Hinted episodes per environment, played when the pool is regenerated
  # (0: as many as episodes_per_env; the arms may differ, as the
  # reference's --spade-hint-plays-per-game and trajectories-per-game do).
  c.agent.hint_episodes_per_env = 0
  # One training row per episode whose history was never truncated (the
  # reference builds one token sequence per episode with a loss mask); the
  # prompts then grow by the sampled tokens. False: one row per turn, each
  # holding the whole history again.
  c.agent.episode_rows = True
  # Each turn of an episode continues the KV cache its slot still holds from
  # its previous turn (`spade.sampling.slot_server`): only the tokens after
  # that history are prefilled, not the whole history again. False prefills
  # every turn's prompt whole. Models with sliding windows (Gemma 3) always
  # do.
  c.agent.carry_cache = True
  # An episode's return. "final_if_terminated" (the reference's
  # `episode_reward`): the last reward, clipped to [-1, 1], if the
  # environment terminated the episode, else 0. "clipped_total" (ours
  # before): the total reward clipped to [0, 1] (erases penalties).
  c.agent.return_rule = "final_if_terminated"
  # How a turn is prompted (spade/agent/prompts.py). "reference": the
  # reference's actor template, no system message, the observation wrapped
  # in "You are playing a language game..." / "...put your final answer
  # within \boxed{}.", the hint as "HINT: ". "system" (ours): one
  # system message for games and tools, the hint as "Hint: ".
  c.agent.prompt_style = "reference"
  # The reference plays hinted episodes only to score the environment; True
  # also trains the agent on them (ours).
  c.agent.train_on_hinted = False
  # What step() receives (`spade.agent.actions.step_action`): "parse" (the
  # reference's parse_action: `\boxed{...}` of a game reply, the stripped
  # reply otherwise) or "raw" (ours: the whole reply).
  c.agent.action = "parse"
  # A reply that hit its token limit without a stop token: "end" (the
  # reference, orchestrator._play_game_async: the episode ends, no step) or
  # "step" (ours: stepped as it is).
  c.agent.unfinished_reply = "end"
  # The hinted arm's rule: "step" (the reference's hinted plays never check
  # EOS, `orchestrator._play_game_with_hint_async`) or "end" (as unhinted).
  c.agent.hinted_unfinished_reply = "step"
  # A next prompt that does not fit the context: "end" (the reference: the
  # episode ends, truncated) or "drop_oldest" (ours: the oldest
  # exchanges are dropped to go on).
  c.agent.full_context = "end"
  # A reply to a tool-use environment that opens a <tool_call> the parser
  # cannot read (and gives no <answer>): False (the reference's default)
  # trains it like any reply; True (its tool-use recipe,
  # SPADE_MASK_MALFORMED_TOOLCALL=1) steps it with no loss and adds the
  # reference's [FORMAT] note to the observation.
  c.agent.mask_malformed_tool_calls = False
  # True (the reference's --spade-compact-filter, set by its tool-use
  # recipe): episodes the environment did not terminate (truncated, a reply
  # cut off, out of turns or context) carry no loss; their returns still
  # count in the group's advantages. False: the reference's default.
  c.agent.compact_filter = False
  # Unhinted plays per environment: > 0 plays ceil(this / #valid) on each
  # (the reference: global batch 192 / the games played, orchestrator.
  # collect_trajectories); 0 plays `episodes_per_env` each (small configs).
  c.agent.plays_per_iteration = 0
  # False: no hinted arm at all (the reference's fixed-environment baselines
  # play unhinted only: its static pool never regenerates, so it never plays
  # hinted). train.mode="adaptive" never plays hinted.
  c.agent.play_hinted = True
  # Times an unhinted play whose environment failed (not by hanging) is
  # played again, same seed (the reference's play_games_async: 1); 0: dropped
  # at once (ours before).
  c.agent.retry_failed_plays = 1

  c.regret = ConfigDict()
  # "hint" | "max" | "learnability" | "lcb" | "reference" | "solve_rate"
  c.regret.estimator = "reference"  # the reference's blend reward
  c.regret.invalid_penalty = -1.0
  # "reference": regret_weight * clip(gap / regret_scale, 0, 1)
  #              + plateau_weight * plateau(no-hint win rate).
  c.regret.regret_weight = 0.4
  c.regret.regret_scale = 0.15
  c.regret.plateau_weight = 0.6
  c.regret.plateau_lo = 0.4
  c.regret.plateau_hi = 0.6
  c.regret.plateau_ramp = 0.25
  c.regret.lcb_quantile = 0.1  # "lcb": quantile of the hint-gap posterior
  # Window rewards (`spade.regret.delayed`): the blend's regret term from
  # the regeneration step's unhinted plays only, "matched" (the reference,
  # recompute_delayed_env_rewards_blend), or from the whole window's,
  # "window" (ours); the plateau always uses the whole window.
  c.regret.timing = "matched"
  # The window's designer reward (registered in `spade.regret.delayed`;
  # the reference's --spade-env-reward-variant): "blend" (the games recipe),
  # "regret_based", "micro_lp", "solve_rate", "learning_potential".
  c.regret.window_reward = "blend"
  # Designer rewards are multiplied by min(#actor rows / #design rows x
  # regeneration interval, this) (utils/rewards.compute_env_reward_scale,
  # --spade-max-env-reward-scale 50); 0 turns the weight off.
  c.regret.max_env_reward_scale = 50.0
  # learning_potential: fast/slow EMA weights on the new value
  # (--spade-gamma1 0.98 / --spade-gamma2 0.85 in the games recipe).
  c.regret.lp_gamma_fast = 0.98
  c.regret.lp_gamma_slow = 0.85
  c.regret.timeout_penalty = -0.5  # regret_based: a step() that timed out
  # The reference's eps (trajectory_build.py, mode "grpo"): 1e-8.
  c.regret.advantage_eps = 1e-8  # (r - mean) / (std + eps)
  c.regret.separate_arms = False  # agent baseline per (env, hinted) if True
  # Agent: "normalize" (the reference: each game's rewards z-scored,
  # (r - mean) / (std + eps), `--spade-reward-normalization grpo` in
  # cmd/games/train_spade_30b.sh, spade/core/utils/trajectory_build.py; the
  # script's --disable-grpo-std-normalization acts on slime's own estimator,
  # which sees one-sample groups there and is disabled by
  # --disable-rewards-normalization); "center": r - mean only (ours: keeps
  # the size of a difference instead of making every pair +-1).
  c.regret.agent_advantage = "normalize"
  # Designer: "center" (the reference: blend rewards centred per skill, no
  # std, delayed_env_rewards._apply_centered_rewards); "normalize" (ours).
  c.regret.designer_advantage = "center"

  c.optim = ConfigDict()
  c.optim.learning_rate = 1e-5
  c.optim.clip_low = 0.2
  c.optim.clip_high = 0.28
  c.optim.kl_coef = 0.0
  # Ours: a KL weight for the designer's rows only, added to kl_coef there
  # (the reference has one coefficient), against the policy self-play
  # starts from; under it designs without signal stay update rows. Tried on
  # the curriculum ladder, where a small model's programs break as updates
  # move their template: at 0.3 validity came back on one seed of two, at
  # 1.0 (configs/curriculum.py) on both; the frontier gained nothing
  # (docs/curriculum.md).
  c.optim.designer_kl_coef = 0.0
  # The KL term's per-token estimate: "low_var_kl" (slime's, the tool-use
  # recipe's --kl-loss-type): k3 clamped to [-10, 10]; "k3": unclamped.
  c.optim.kl_estimator = "low_var_kl"
  c.optim.designer_loss_weight = 1.0
  c.optim.agent_loss_weight = 1.0
  # How the policy loss is reduced: "sample_mean" (slime as the reference
  # runs it, no --calculate-per-token-loss): each row's token mean, summed
  # over both roles' rows and divided by the batch's samples (zero-advantage
  # rows included; `global_batch_size` below); "token_mean" (ours): each
  # role's token mean, the roles added with their loss weights.
  c.optim.loss_reduction = "sample_mean"
  # The update's batch in samples (a design or an agent episode each), as
  # the reference's --global-batch-size 192 shapes it (`selfplay.batching.
  # shape_batch`): designs first, agent episodes duplicated round-robin to
  # fill it or trimmed from its end, the loss divided by its real samples;
  # by copy counts, so no extra row is scored. 0 (ours): every row once,
  # divided by the rows there were. "sample_mean" only.
  c.optim.global_batch_size = 192
  # Iterations a closed window's designer rows wait before they train. The
  # reference (`--spade-proposer-training-delay 4` at interval 4) buffers a
  # regeneration rollout's designer samples and trains them at the next
  # rollout that generates (`spade/slime/spade_rollout.py`, lines 548-561):
  # rollout r's designs train with rollout r + 4's agent rows, one rollout
  # after its window (r .. r + 3) closes here. 0 (ours): when it closes.
  c.optim.designer_delay = 1
  # The last iteration scores the open window on its plays so far and trains
  # every designer row still waiting (the reference flushes its buffer at
  # its final rollout, `spade_rollout.py`); False: they are lost (ours).
  c.optim.flush_designer_rows = True
  c.optim.max_importance_weight = 2.0
  # Designer rows with truncated importance sampling (the reference's
  # --use-tis, `tis_clip` = max_importance_weight); False: PPO clipping
  # against their sampling-time log-probs (ours).
  c.optim.designer_tis = True
  # Agent rows too, as slime's --use-tis weighs every sample; False: PPO
  # clipping against the sampler's log-probs (ours).
  c.optim.agent_tis = True
  # Positions per chunk when the update scores tokens: bounds the logits held
  # at once to [rows, chunk, vocab] (recomputed in the backward pass).
  c.optim.logprob_chunk = 256
  # Rows per micro-batch of the update (0: a role's whole sub-batch at once);
  # gradients are accumulated, the token-level mean is exact.
  c.optim.microbatch_rows = 0
  # Recompute each micro-batch's forward in the backward pass, keeping only
  # its inputs across the scan. With `model.remat` set, each layer already
  # keeps only its input, so False saves a whole forward pass per step (a
  # fifth of the update's FLOPs) for tokens x layers x embed_dim floats.
  c.optim.microbatch_remat = True
  # Optimizer steps per sampled batch: epochs x minibatches of shuffled rows,
  # each scored against the sampler's logprobs (so the clip binds after the
  # first). The reference takes one step per rollout (slime's global batch
  # is the whole rollout): 1 x 1.
  c.optim.epochs = 1
  c.optim.num_minibatches = 1
  c.optim.grad_clip = 1.0  # global-norm clipping; 0 turns it off
  c.optim.weight_decay = 0.0
  # Which parameters decay: "megatron" (the reference's trainer: matrices
  # only, no bias or norm scale) or "all" (optax's default, ours before).
  c.optim.weight_decay_mask = "megatron"
  c.optim.b1 = 0.9
  c.optim.b2 = 0.999
  c.optim.eps = 1e-8
  # Low-rank adapters (spade/train/lora.py): > 0 trains rank-r factors of
  # every projection and head kernel instead of the weights (the reference's
  # Tinker backend uses 32); 0 is full fine-tuning, its slime backend.
  c.optim.lora_rank = 0
  c.optim.lora_alpha = 32.0  # the adapters' product is scaled by alpha / rank

  c.train = ConfigDict()
  # "spade" | "fixed_pool" | "adaptive" (a levelled family, train.family,
  # at each environment's difficulty window: spade.selfplay.adaptive).
  c.train.mode = "spade"
  c.train.checkpoint_every = 1
  c.train.keep_checkpoints = 3
  c.train.warm_start_steps = 0
  c.train.warm_start_batch = 4
  # A folder of environment programs (*.py) the designer's warm start learns
  # to write instead of the seed library's, from the design phase's own
  # prompt; they teach the agent nothing (experiments/curriculum.py).
  c.train.warm_start_dir = ""
  c.train.save_programs = True
  # With save_programs: every episode's turns (actions, rewards,
  # observations) in programs/iter_NNNNNN/episodes.jsonl.
  c.train.save_episodes = True
  # fixed_pool mode: a folder of environment programs (*.py) to play instead
  # of the seed library; each is validated first, sampled with replacement
  # when the pool is smaller than designer.num_envs.
  c.train.pool_dir = ""
  # fixed_pool mode without pool_dir: these seed programs only, by name
  # (`spade.environments.library`; empty: every training seed).
  c.train.pool_seeds = ()
  # fixed_pool mode: how an iteration's programs are drawn from the pool.
  # "without_replacement" (the reference's static pool, spade/slime/
  # spade_rollout._select_static_games_without_replacement: the sorted pool
  # shuffled once with the seed, taken in order, reshuffled when used up;
  # its cursor is in the checkpoint) or "with_replacement" (ours: each
  # iteration draws afresh, with replacement only when the pool is smaller
  # than designer.num_envs).
  c.train.pool_draw = "with_replacement"
  # adaptive mode: the levelled family played (spade.environments.levels:
  # "rlve" is RLVE's 16 official environments).
  c.train.family = ""

  # The sliding-window difficulty controller of adaptive mode
  # (spade.environments.difficulty.SlidingWindow; the reference's
  # --spade-difficulty-tau-acc 0.9 --spade-difficulty-tau-num 128
  # --spade-difficulty-d-delta 4 and the RLVE adapter's cap 20).
  c.difficulty = ConfigDict()
  c.difficulty.tau_acc = 0.9
  c.difficulty.tau_num = 128
  c.difficulty.d_delta = 4
  c.difficulty.min_level = 0  # every window starts at [min_level, min_level]
  c.difficulty.max_level = 20

  c.memory = ConfigDict()
  c.memory.enabled = True
  # The reference keeps a FIFO of 200 (--spade-env-memory-max-size 200).
  c.memory.capacity = 200
  # Which examples a designer prompt shows: "reference" (spade/core/
  # env_memory.py via `spade.memory.fifo`: 2 positives of the prompt's skill
  # with win rate in [0.15, 0.85] drawn from the top max(3n, 10) by regret,
  # code cut to `code_chars`, 1 negative of the skill by name) or
  # "archive" (ours: top regret + document neighbour + latest invalid).
  c.memory.retrieval = "reference"
  c.memory.code_chars = 2000
  c.memory.num_negatives = 1
  c.memory.duplicate_threshold = 0.85
  c.memory.num_examples = 2
  # Ours, off in the reference: programs the FIFO memory holds from the
  # start, so its retrieval shows two valid programs of the prompt's skill
  # from the first design on, as the reference's prompt looks once its
  # memory has filled. "library": the seed library's training programs
  # (spade/environments/seeds, by skill); a folder: its *.py programs, shown
  # to every skill; "": none (the reference). Cut to memory.code_chars.
  c.memory.seed_dir = ""
  c.memory.replay_fraction = 0.0
  c.memory.replay_temperature = 1.0
  c.memory.staleness_coef = 0.3
  # Capacity policy: past `capacity`, evict invalid entries (oldest first),
  # then the lowest latest-regret valid one; never the `keep_recent` newest.
  c.memory.keep_recent = 32
  c.memory.mutation_pool = 8  # mutation parents: the top-N by regret
  # Fraction of designer prompts that edit `Archive.mutation_parent` into a
  # harder variant instead of writing from scratch (0: no mutation).
  c.memory.mutation_fraction = 0.0

  c.grounding = ConfigDict()
  c.grounding.enabled = True
  c.grounding.source = (
      "builtin"  # "builtin" | "jsonl" | "text" | "tfds" | "seqio"
  )
  c.grounding.path = ""  # jsonl/text: file, dir or glob; tfds: data_dir
  c.grounding.name = ""
  c.grounding.max_words = 200  # reference: 6000 (games), 4000 (tool use)
  # A document's text: "reference" (stripped; over max_words, the words
  # joined by single spaces and "[Document truncated at ~N words]") or
  # "layout" (ours: cleaned, lines kept, the note without "~").
  c.grounding.text_rule = "reference"
  c.grounding.seed = 0  # sampling order; the cursor is in the checkpoint
  c.grounding.split = "train"  # tfds / seqio split
  c.grounding.text_key = "text"  # jsonl field / tfds or seqio feature
  c.grounding.title_key = "title"
  c.grounding.module = ""  # seqio: module to import that registers the task
  c.grounding.max_documents = 0  # per process; 0: all
  # False: every process reads the same document stream, so a run's results
  # do not depend on how many processes it has. True: each process reads its
  # own shard (for corpora too big to read everywhere) and the iteration's
  # documents are gathered from all of them.
  c.grounding.per_process_shards = False

  c.eval = ConfigDict()
  c.eval.every = 0  # 0: no in-loop evaluation
  c.eval.suites = ()
  c.eval.num_examples = 8
  c.eval.seed = 1234  # fixes which items each suite draws
  c.eval.batch_size = 8  # prompts per sampling call
  c.eval.max_new_tokens = 0  # 0: config.agent.max_new_tokens
  c.eval.temperature = 0.0  # 0: greedy
  c.eval.max_turns = 0  # seed_heldout episodes; 0: config.agent.max_turns
  c.eval.reasoning_gym_categories = (
      "basic_arithmetic",
      "chain_sum",
      "leg_counting",
      "word_sorting",
      "letter_counting",
      "spell_backward",
      "number_sorting",
      "gcd",
  )
  c.eval.humaneval_timeout_s = 10.0
  c.eval.bfcl_categories = ("simple_python", "multiple")
  c.eval.bfcl_download = True  # False: use the cache or the own held-out set
  c.eval.bfcl_cache_dir = ""  # empty: ~/.cache/spade/bfcl

  # `python -m spade.compile`: the update's batch shapes to compile for; 0
  # takes the config's worst case as `make_batch` would round it.
  c.compile = ConfigDict()
  c.compile.agent_rows = 0
  c.compile.agent_len = 0
  c.compile.designer_rows = 0
  c.compile.designer_len = 0
  return c


# Choices that must be one of a fixed set: dotted key -> allowed values.
_CHOICES = {
    "model.family": ("gemma3", "qwen2", "qwen3"),
    "sampling.in_place": ("auto", "on", "off"),
    "model.mlp_activation": ("gelu", "silu"),
    "model.dtype": ("float32", "bfloat16"),
    "model.param_dtype": ("float32", "bfloat16"),
    # The keys of spade.model.architecture.REMAT_POLICIES (and an alias).
    "model.remat": (
        "none", "full", "minimal", "save_dot_with_context_except_mlp",
        "save_dot_except_mlpwi", "save_dot_except_mlp",
        "save_dots_except_mlp", "save_qkv_proj", "save_out_proj",
    ),  # fmt: skip
    "checkpoint.kind": ("scratch", "gemma3_gguf", "qwen2_gguf", "hf"),
    "tokenizer.kind": ("bytes", "gemma_sp", "qwen_bpe"),
    "sandbox.backend": ("gvisor", "bwrap", "none"),
    "sandbox.budgets": ("reference", "strict"),
    "designer.prompt_family": (
        "single_turn_game",
        "multi_turn_game",
        "corpus_game",
        "tool_use",
        "tool_use_multi_turn",
    ),
    "designer.hint_source": ("writer", "program"),
    "designer.hint_parse": ("reference", "first_paragraph"),
    "designer.duplicates": ("play", "refuse"),
    "regret.agent_advantage": ("center", "normalize"),
    "regret.timing": ("matched", "window"),
    "designer.code_extraction": ("reference", "longest_class"),
    "designer.prompt_overflow": ("refuse", "cut_left"),
    "designer.prompt_example": ("skeleton", "skeleton_max_turns", "complete"),
    "agent.action": ("parse", "raw"),
    "agent.unfinished_reply": ("end", "step"),
    "agent.hinted_unfinished_reply": ("end", "step"),
    "agent.full_context": ("end", "drop_oldest"),
    "memory.retrieval": ("reference", "archive"),
    "designer.invalid_designs": ("drop", "penalize"),
    "regret.designer_advantage": ("center", "normalize"),
    "agent.return_rule": ("final_if_terminated", "clipped_total"),
    "agent.prompt_style": ("reference", "system"),
    "train.pool_draw": ("with_replacement", "without_replacement"),
    "grounding.source": ("builtin", "jsonl", "text", "tfds", "seqio"),
    "grounding.text_rule": ("reference", "layout"),
    "optim.weight_decay_mask": ("megatron", "all"),
    "optim.loss_reduction": ("sample_mean", "token_mean"),
    "optim.kl_estimator": ("low_var_kl", "k3"),
}


def choices() -> dict[str, tuple[str, ...]]:
  """Every key with a fixed set of values -> its allowed values: `_CHOICES`
  and the names registered beside their code (estimators and window rewards
  in `spade.regret`, modes in `spade.train.modes`), read when asked so a
  name registered after import is allowed too."""
  return {
      **_CHOICES,
      "regret.estimator": estimators.estimator_names(),
      "regret.window_reward": delayed.window_reward_names(),
      "train.mode": modes.names(),
  }


# Keys that must be strictly positive.
_POSITIVE = (
    "model.vocab_size",
    "model.embed_dim",
    "model.num_layers",
    "model.num_heads",
    "model.num_kv_heads",
    "model.head_dim",
    "model.mlp_dim",
    "model.max_len",
    "designer.num_envs",
    "designer.max_new_tokens",
    "agent.episodes_per_env",
    "agent.max_turns",
    "agent.max_new_tokens",
    "agent.max_context",
    "sandbox.num_sandboxes",
    "sampling.slots",
    "sampling.prefill_rows",
    "sampling.decode_steps",
    "optim.learning_rate",
    "optim.lora_alpha",
)


def tpu_pod_config(
    shapes: dict[str, Any],
    *,
    fsdp: int,
    tensor: int,
    checkpoint_kind: str,
    tokenizer_kind: str,
    variant: str | None,
    config_file: str,
) -> ConfigDict:
  """The TPU configs' shared body: a model on a slice, reference-sized rollouts.

  Rollouts follow the reference implementation: 24 environments an
  iteration, 16 episodes with and 16 without a hint each, up to 25 turns;
  `spade.compile` checks the update at that size. `configs/gemma3_tpu.py`
  and `configs/qwen3_*_tpu.py` call this with their shapes and mesh, so the
  sizes cannot drift apart.

  Args:
    shapes: `config.model` values (`architecture.gemma3_shapes(...)`, ...).
    fsdp, tensor: the parameter sharding; `mesh.data=-1` takes every other
      device, so the config fits any slice of a multiple of fsdp * tensor.
    checkpoint_kind, tokenizer_kind: `config.checkpoint.kind`, ...
    variant: the config file's argument: None or "" for the pod config;
      "runlocal" for the same settings with a tiny byte-level model, small
      rollouts and a 2x2 (fsdp x tensor) mesh, to build and step on a CPU
      with 8 fake devices.
    config_file: the calling config's path, named when `variant` is unknown.
  """
  if variant not in (None, "", "runlocal"):
    raise ValueError(
        f"{config_file} has no variant {variant!r} (try 'runlocal')"
    )
  c = base_config()
  c.num_iterations = 200

  m = c.model
  m.update(shapes)
  m.max_len = 8192
  m.dtype = "bfloat16"
  # Float32 master weights: bfloat16 updates at lr ~1e-6 round to nothing.
  m.param_dtype = "float32"

  c.checkpoint.kind = checkpoint_kind
  c.checkpoint.path = ""  # give it with --config.checkpoint.path
  c.tokenizer.kind = tokenizer_kind

  c.mesh.data = -1
  c.mesh.fsdp, c.mesh.tensor = fsdp, tensor
  if tensor > 1:
    # A one-token step's down projection on the train split, gate and up's
    # hidden over tensor first (`layers.DECODE_PARAM_AXES`), and its
    # residual stream's width over fsdp, where the projections meet it
    # (`layers.residual`): the Gemma 3 12B's and 27B's (tensor 4 and 8)
    # every-slot steps read less.
    rules = dict(c.mesh.rules)
    rules["decode_mlp"] = ("tensor", "fsdp")
    rules["decode_down"] = "tensor"
    rules["decode_embed"] = "fsdp"
    rules["decode_residual"] = "fsdp"
    c.mesh.rules = tuple(rules.items())
    # Under those rules a one-token step's MLP runs on its rows padded to
    # the TPU's 128 lanes when there are 64 or more (`layers.padded_rows`:
    # the 12B's gathered 192 and 96 rows read 8% less a step).
    c.model.decode_mlp_pad_rows = 128
    # The MLP as one kernel that gathers its input and hidden into VMEM,
    # not HBM (`spade.model.fused_mlp`; XLA's matmuls off a TPU): the 12B's
    # every-slot step 1.28 -> 1.14 of its minimum, the 27B's 1.50 -> 1.22.
    c.model.decode_mlp_kernel = "pallas"

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
  # Every turn's prompt prefilled whole. Chosen when lock-step calls kept
  # extra caches between turns (61.6 GiB a chip for Qwen3 4B on v5p-32); a
  # slot keeps its history in its own cache rows, so this is worth
  # measuring again. Gemma 3's sliding windows never carry a cache anyway.
  c.agent.carry_cache = False
  # A prefill step's attention scores are rows x heads x chunk x 8,704 keys:
  # at 512 columns the Qwen3 4B agent's asked for 188 GB a chip.
  c.sampling.prefill_chunk = 128
  # The slot engine: 256 slots, each a model.max_len cache; 16 prompts a
  # prefill-insert (a multiple of every named slice's batch shards) and 32
  # tokens a generate call.
  c.sampling.slots = 256
  c.sampling.prefill_rows = 16
  c.sampling.decode_steps = 32
  # No cap on the gathered row counts: with each chip moving its own rows,
  # every count reads less a step than a call on every slot
  # (`spade.compile --engine --bytes_breakdown`, 2026-12-06: Gemma 3 1B on a
  # v5p-8 0.14-0.82 of every slot's bytes at 4-192 rows of 256, 4B on a
  # v5p-32 0.21-0.95 at 16-192; docs/scale.md). The 12B and 27B's every
  # count fits (compiled 2026-12-06), and the Qwen3 4B's and 8B's on v5p-32
  # (2026-12-07, 0.81 of every slot's step at 192 rows); `spade.compile
  # --engine` checks that every count fits before a run.
  c.sampling.max_gathered_rows = 0

  c.regret.estimator = "reference"
  c.optim.learning_rate = 1e-6
  # Without these the update of the reference's rollout (below) needs ~924
  # GiB of temporaries per v5p chip (`python -m spade.compile`, Gemma 3 1B):
  # micro-batches of 64 rows, each layer recomputed in the backward pass.
  c.optim.microbatch_rows = 64
  m.remat = "full"
  c.optim.kl_coef = 0.0
  # The reference's delay of 4 (8 for tool use) is its window's length:
  # the rows train one iteration after the window closes (base_config).
  c.optim.designer_delay = 1
  # The reference's global batch is its unhinted plays an iteration (192 =
  # 24 games x ceil(192 / 24)); these configs play 16 a game, so theirs is
  # 384: a closing window's designs still take the place of as many agent
  # episodes, and no iteration trims half of what it played.
  c.optim.global_batch_size = c.designer.num_envs * c.agent.episodes_per_env

  # `spade.compile` checks the update at the reference's rollout size: 1024
  # agent turns of up to 4096 tokens, 32 designs of up to 6144.
  c.compile.agent_rows = 1024
  c.compile.agent_len = 4096
  c.compile.designer_rows = 32
  c.compile.designer_len = 6144

  c.train.checkpoint_every = 5
  c.train.keep_checkpoints = 3
  c.memory.replay_fraction = 0.25

  if variant == "runlocal":
    _shrink_for_cpu(c)
  return c


def _shrink_for_cpu(c: ConfigDict) -> None:
  """Tiny byte model and rollouts; keeps the family switches and mesh axes."""
  c.num_iterations = 1
  # A byte model's context holds only the instructions' tail.
  c.designer.prompt_overflow = "cut_left"
  m = c.model
  m.vocab_size = 256 + 3
  m.num_layers = 2
  m.embed_dim = 64
  m.num_heads = 4
  m.num_kv_heads = 2
  m.head_dim = 16
  m.mlp_dim = 128
  if m.sliding_window:
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
  c.sampling.slots = c.sampling.prefill_rows = 4  # batch shards: 2 x 2
  c.sampling.decode_steps = 8
  c.optim.designer_delay = 0
  c.optim.microbatch_rows = 0
  c.compile.agent_rows = c.compile.agent_len = 0
  c.compile.designer_rows = c.compile.designer_len = 0
  c.train.checkpoint_every = 1


class ConfigError(ValueError):
  """A config that cannot run; the message names the key."""


def validated(
    config: ConfigDict, fail: Callable[[str], NoReturn]
) -> ConfigDict:
  """Returns `config` if `validate` passes, else calls `fail` with its error.

  The entry points' one rule for a bad config: one line, no traceback.

  Args:
    config: the config to check.
    fail: prints its message and exits (`spade.cli.fail`).
  """
  try:
    validate(config)
  except ConfigError as e:
    fail(str(e))
  return config


def load_file(spec: str, root: str = "") -> ConfigDict:
  """The config of `path[:arg]`, as absl's config flags load it: the file's
  `get_config(arg)` (None without an arg); a relative path is taken from
  `root` (default: the working directory)."""
  path, _, arg = spec.partition(":")
  if root and not os.path.isabs(path):
    path = os.path.join(root, path)
  module_spec = importlib.util.spec_from_file_location("_spade_config", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg or None)


def _get(config: ConfigDict, dotted: str):
  node = config
  for part in dotted.split("."):
    node = node[part]
  return node


def slot_engine_options(sampling: ConfigDict) -> dict[str, int | bool | None]:
  """The `SlotEngine` arguments `config.sampling` sets as they are (the
  slot and prefill-row counts, rounded to the mesh, are the caller's): one
  place for the loop's engine and `spade.compile`'s copy of it."""
  return dict(
      prefill_chunk=sampling.prefill_chunk,
      decode_steps=sampling.decode_steps,
      min_rows=sampling.min_rows,
      max_gathered_rows=sampling.max_gathered_rows,
      put_steps_from=sampling.put_steps_from,
      in_place={"auto": None, "on": True, "off": False}[sampling.in_place],
  )


def validate(config: ConfigDict, reference: ConfigDict | None = None) -> None:
  """Checks keys, types and combinations; raises `ConfigError` on the first.

  Args:
    config: the config to check.
    reference: the tree whose keys and types are allowed; `base_config()` when
      omitted. A key in `config` that is absent here is an error, so a typo in a
      config file is caught as surely as one on the command line.
  """
  reference = base_config() if reference is None else reference
  _check_tree(config, reference, prefix="")
  for key, allowed in choices().items():
    value = _get(config, key)
    if value not in allowed:
      raise ConfigError(f"config.{key}={value!r} is not one of {allowed}")
  for key in _POSITIVE:
    if _get(config, key) <= 0:
      raise ConfigError(f"config.{key}={_get(config, key)!r} must be > 0")
  m = config.model
  if m.num_heads % m.num_kv_heads:
    raise ConfigError(
        f"config.model.num_heads={m.num_heads} must be a multiple of "
        f"config.model.num_kv_heads={m.num_kv_heads}"
    )
  if m.sliding_window < 0:
    raise ConfigError("config.model.sliding_window must be >= 0")
  if config.tokenizer.kind == "bytes" and m.vocab_size < 259:
    raise ConfigError(
        f"config.model.vocab_size={m.vocab_size} is too small for the byte "
        "tokenizer (needs >= 259)"
    )
  for axis in ("data", "fsdp", "tensor"):
    size = config.mesh[axis]
    if size == 0 or size < -1:
      raise ConfigError(f"config.mesh.{axis}={size} must be -1 or >= 1")
  if config.agent.max_context > m.max_len:
    raise ConfigError(
        f"config.agent.max_context={config.agent.max_context} exceeds "
        f"config.model.max_len={m.max_len}"
    )
  if not 0.0 <= config.memory.replay_fraction <= 1.0:
    raise ConfigError("config.memory.replay_fraction must be in [0, 1]")
  if config.num_iterations < 0:
    raise ConfigError("config.num_iterations must be >= 0")
  if config.agent.retry_failed_plays < 0:
    raise ConfigError(
        "config.agent.retry_failed_plays="
        f"{config.agent.retry_failed_plays} must be >= 0 (0: no retry)"
    )
  if config.sampling.prefill_chunk < 0:
    raise ConfigError(
        f"config.sampling.prefill_chunk={config.sampling.prefill_chunk} must"
        " be >= 0 (0: the whole prompt in one step)"
    )
  if config.sampling.min_rows < 0:
    raise ConfigError(
        f"config.sampling.min_rows={config.sampling.min_rows} must be >= 0"
        " (0: generate runs on every slot)"
    )
  if config.sampling.max_gathered_rows < 0:
    raise ConfigError(
        "config.sampling.max_gathered_rows="
        f"{config.sampling.max_gathered_rows} must be >= 0 (0: no cap)"
    )
  if config.sampling.put_steps_from < 1:
    raise ConfigError(
        f"config.sampling.put_steps_from={config.sampling.put_steps_from}"
        " must be >= 1 (rows a shard; a large value keeps the whole-row put)"
    )
  for key in ("step_timeout_s", "call_timeout_s", "validate_timeout_s"):
    if config.sandbox[key] < 0:
      raise ConfigError(
          f"config.sandbox.{key}={config.sandbox[key]} must be >= 0 (0: the"
          f" value of sandbox.budgets={config.sandbox.budgets!r})"
      )
  chunk = config.sampling.prefill_chunk
  if chunk and m.max_len % chunk:
    raise ConfigError(
        f"config.model.max_len={m.max_len} (the slot engine's cache) is not a"
        f" multiple of config.sampling.prefill_chunk={chunk}: pick a chunk"
        " that divides it"
    )
  if modes.get(config).levelled and not config.train.family:
    raise ConfigError(
        f"config.train.mode={config.train.mode!r} plays a levelled family and"
        " needs config.train.family (one of spade.environments.levels, e.g."
        ' "rlve")'
    )
  d = config.difficulty
  if d.tau_num < 1 or d.d_delta < 1 or d.max_level < d.min_level:
    raise ConfigError(
        f"config.difficulty: tau_num={d.tau_num} and d_delta={d.d_delta} must"
        f" be >= 1 and max_level={d.max_level} >= min_level={d.min_level}"
    )
  if not 0.0 <= d.tau_acc <= 1.0:
    raise ConfigError(
        f"config.difficulty.tau_acc={d.tau_acc} must be in [0, 1]"
    )
  o = config.optim
  if o.global_batch_size < 0:
    raise ConfigError(
        f"config.optim.global_batch_size={o.global_batch_size} must be >= 0"
        " (0: no batch shaping)"
    )
  if o.global_batch_size and o.loss_reduction != "sample_mean":
    raise ConfigError(
        f"config.optim.global_batch_size={o.global_batch_size} shapes the"
        ' batch of config.optim.loss_reduction="sample_mean" only; with'
        f" loss_reduction={o.loss_reduction!r} set"
        " config.optim.global_batch_size=0"
    )
  if config.optim.lora_rank < 0:
    raise ConfigError(
        f"config.optim.lora_rank={config.optim.lora_rank} must be >= 0"
        " (0: full fine-tuning)"
    )


def _check_tree(config: ConfigDict, reference: ConfigDict, prefix: str):
  for key in config.keys():
    name = prefix + key
    if key not in reference:
      raise ConfigError(f"config.{name} is not a known key")
    value, ref = config[key], reference[key]
    if isinstance(ref, ConfigDict):
      if not isinstance(value, ConfigDict):
        raise ConfigError(f"config.{name} must be a section, got {value!r}")
      _check_tree(value, ref, name + ".")
      continue
    if not _same_type(value, ref):
      raise ConfigError(
          f"config.{name}={value!r} has type {type(value).__name__}, "
          f"expected {type(ref).__name__}"
      )


def _same_type(value, ref) -> bool:
  if isinstance(ref, bool) or isinstance(value, bool):
    return isinstance(value, bool) and isinstance(ref, bool)
  if isinstance(ref, float):
    return isinstance(value, (int, float))
  if isinstance(ref, (tuple, list)):
    return isinstance(value, (tuple, list))
  return isinstance(value, type(ref))
