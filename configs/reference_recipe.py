"""The reference's 30B games recipe, knob for knob, on a model we support.

`spade-rl/spade` `cmd/games/train_spade_30b.sh` (with the defaults of
`spade/core/types.py` where the script sets nothing) trains
Qwen3-30B-A3B-Instruct; any supported model stands in here (default:
Qwen2.5-Coder-0.5B-Instruct from its GGUF, the one reachable on a CPU).
`docs/reference_recipe.md` lists every knob with the reference's value and
file, ours, and the named alternatives. Run:

  python -m spade.main --config=configs/reference_recipe.py \
      --workdir=/tmp/reference_recipe
  python -m spade.main --config=configs/reference_recipe.py:runlocal \
      --workdir=/tmp/reference_recipe_runlocal

The full recipe needs an accelerator slice (24 environments x ceil(192 / 24)
unhinted + 16 hinted plays x 25 turns x 8192 tokens per reply); `runlocal`
keeps every behaviour and shrinks only the sizes, so it runs on a CPU.

The paper's baselines and its tool-use recipe are variants of it, each with
a CPU twin (the tiny byte-level model, one short iteration) that
tests/selfplay/test_recipe_variants.py runs:

  rlve         RLVE's 16 official environments (rlve-gym), each at its
               sliding-window level (cmd/games/train_fixed_rlve_*.sh):
               `train.mode="adaptive"`, `train.family="rlve"`; one shared
               problem per environment, 16 plays, temperature 1.0, per-group
               z-score, controller 0.9 / 128 / width 4 / cap 20; no
               designer, no hints; `difficulty/<environment>` in metrics.
  static_pool  a folder of validated programs (give
               --config.train.pool_dir=DIR; the seed library otherwise)
               drawn without replacement, 24 games x 8 plays, temperature
               0.6, no designer, no hints (cmd/games/_train_fixed_gpt55.sh).
  tool_use     cmd/tool_use/_train_spade_blend.sh: the six tool-use skills,
               multi-turn tasks, regeneration and designer delay 8,
               4,000-word documents, 2,048-token value-free hints, KL 0.005,
               the reset gate (SPADE_RESET_GATE=1).

  python -m spade.main --config=configs/reference_recipe.py:rlve \
      --workdir=/tmp/rlve
  python -m spade.main --config=configs/reference_recipe.py:rlve_runlocal \
      --workdir=/tmp/rlve_runlocal
  python -m spade.main --config=configs/reference_recipe.py:static_pool \
      --config.train.pool_dir=DIR --workdir=/tmp/static_pool
  python -m spade.main --config=configs/reference_recipe.py:tool_use \
      --config.grounding.source=jsonl --config.grounding.path=CORPUS.jsonl \
      --workdir=/tmp/tool_use

(`_runlocal` of each variant runs the same way.)
"""

import importlib.util
import os

from spade import config as config_lib

VARIANTS = ("rlve", "static_pool", "tool_use")


def _base(name: str):
  """A sibling config module, loaded by path (works from any directory)."""
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".py")
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def get_config(arg=None):
  """The recipe; `arg="runlocal"` shrinks its sizes to a CPU run;
  "rlve", "static_pool", "tool_use" and their "_runlocal" twins are the
  baselines and the tool-use recipe (module docstring)."""
  known = ("runlocal",) + VARIANTS + tuple(v + "_runlocal" for v in VARIANTS)
  if arg not in (None, "") + known:
    raise ValueError(
        f"configs/reference_recipe.py has no variant {arg!r} (one of {known})"
    )
  c = _base("qwen2p5_coder_0p5b").get_config()
  c.num_iterations = 400  # --num-rollout 400
  c.model.max_len = 32768  # --spade-max-context-length 32768
  # Designer: 24 games per rollout, regenerated every 4 rollouts, skills
  # rotated 3 at a time, medium difficulty, multi-turn game template.
  c.designer.num_envs = 24  # --spade-num-games-per-rollout
  c.designer.samples_per_prompt = 1  # one game per (skill, index)
  c.designer.regeneration_interval = 4  # --spade-game-regeneration-interval
  c.designer.skills_per_regen = 3  # SKILLS_PER_REGEN
  c.designer.difficulties = ("medium",)  # --spade-game-difficulty
  c.designer.prompt_family = "multi_turn_game"
  c.designer.temperature = 0.6  # --spade-env-temperature
  c.designer.max_new_tokens = 16384  # --spade-env-max-tokens
  # The prompt may take what the 32,768-token context leaves the reply.
  c.designer.max_prompt_tokens = 32768 - 16384
  c.designer.max_attempts = (
      5  # spade_rollout: collect_trajectories(max_attempts=5)
  )
  c.designer.code_extraction = "reference"  # parsing.extract_game_code
  c.designer.invalid_designs = "drop"
  c.designer.hint_source = "writer"  # --spade-hint-mode self
  c.designer.hint_temperature = 0.3  # --spade-hint-temperature
  c.designer.hint_max_new_tokens = 4096  # --spade-hint-max-tokens
  c.designer.use_seed_programs = False
  c.grounding.max_words = 6000  # --spade-corpus-max-doc-tokens 6000 (words)
  # Agent: ceil(192 / #valid) unhinted plays per game each rollout (the
  # global batch, orchestrator.collect_trajectories); 16 hinted at
  # regeneration; 25 turns. --spade-trajectories-per-game 16 only feeds the
  # fixed evaluation; episodes_per_env is the fallback when
  # plays_per_iteration is 0.
  c.agent.plays_per_iteration = 192  # --global-batch-size 192
  c.agent.episodes_per_env = 8  # 192 / 24
  c.agent.hint_episodes_per_env = 16  # --spade-hint-plays-per-game
  c.agent.max_turns = 25  # --spade-max-turns
  c.agent.max_new_tokens = 8192  # --spade-actor-max-tokens
  c.agent.max_context = 32768 - 8192
  c.agent.temperature = 0.6  # --spade-actor-temperature
  c.agent.return_rule = "final_if_terminated"  # utils/rewards.episode_reward
  c.agent.train_on_hinted = False
  c.agent.action = "parse"  # utils/parsing.parse_action
  c.agent.unfinished_reply = "end"  # no EOS: truncated, no step
  c.agent.full_context = "end"  # < 64 tokens left: truncated
  c.agent.top_p = 0.95  # --spade-actor-top-p
  c.agent.top_k = 20  # --spade-actor-top-k
  c.designer.top_p = 0.95  # --spade-env-top-p
  c.designer.top_k = 20  # --spade-env-top-k
  # Rewards: the blend designer reward (regret at matched timing, plateau
  # over the window), centred per skill and weighted by min(192 / #designs x
  # 4, 50); the agent's rewards z-scored per game
  # (--spade-reward-normalization grpo).
  c.regret.estimator = "reference"  # --spade-env-reward-variant blend
  c.regret.regret_weight = 0.4
  c.regret.regret_scale = 0.15
  c.regret.plateau_weight = 0.6
  c.regret.plateau_lo = 0.4
  c.regret.plateau_hi = 0.6
  c.regret.plateau_ramp = 0.25
  c.regret.timing = "matched"
  c.regret.max_env_reward_scale = 50.0  # --spade-max-env-reward-scale
  c.regret.agent_advantage = "normalize"  # trajectory_build, mode "grpo"
  c.regret.advantage_eps = 1e-8
  c.regret.designer_advantage = "center"  # _apply_centered_rewards
  c.regret.lp_gamma_fast = 0.98  # --spade-gamma1
  c.regret.lp_gamma_slow = 0.85  # --spade-gamma2
  # Memory: a FIFO of 200, env_memory.py's retrieval.
  c.memory.capacity = 200  # --spade-env-memory-max-size 200
  c.memory.retrieval = "reference"
  c.memory.code_chars = 2000
  c.memory.num_examples = 2  # high_regret_seeds(n=2)
  c.memory.num_negatives = 1  # low_quality_examples(n=1)
  # Optimizer: Adam, lr 1e-6 constant, weight decay 0.1, b2 0.98; clip
  # 0.2 / 0.28; no KL; one optimizer step per rollout; truncated IS.
  c.optim.learning_rate = 1e-6
  c.optim.weight_decay = 0.1
  c.optim.b1 = 0.9
  c.optim.b2 = 0.98
  c.optim.clip_low = 0.2
  c.optim.clip_high = 0.28
  c.optim.kl_coef = 0.0
  c.optim.epochs = 1
  c.optim.num_minibatches = 1
  # --global-batch-size 192: designs first, agent episodes duplicated or
  # trimmed to 192 samples (`batching.shape_batch`); the CPU twins keep it
  # (their few episodes are copies, not extra rows).
  c.optim.global_batch_size = 192
  # --spade-proposer-training-delay 4: a regeneration's designer rows train
  # at the next regeneration rollout, one iteration after their window of
  # 4 closes (base_config).
  c.optim.designer_delay = 1
  variant = (arg or "").removesuffix("_runlocal")
  if variant in VARIANTS:
    {"rlve": _rlve, "static_pool": _static_pool, "tool_use": _tool_use}[
        variant
    ](c)
    if arg.endswith("_runlocal"):
      _tiny(c, variant)
    return c
  if arg == "runlocal":
    c.num_iterations = 4
    c.model.max_len = 2048
    c.designer.num_envs = 2
    c.designer.regeneration_interval = 2
    # The whole prompt (~1,400 tokens of instructions and a 200-word
    # document) and a whole program.
    c.model.max_len = 4096
    c.designer.max_new_tokens = 1536
    c.designer.max_prompt_tokens = 2560
    c.designer.max_attempts = 2
    c.designer.hint_max_new_tokens = 256
    c.grounding.max_words = 200
    c.memory.num_examples = 0
    c.agent.plays_per_iteration = 4  # ceil(4 / #valid): 2 with 2 valid
    c.agent.episodes_per_env = 2
    c.agent.hint_episodes_per_env = 2
    c.agent.max_turns = 3
    c.agent.max_new_tokens = 128
    c.agent.max_context = 1024
    c.optim.microbatch_rows = 1
  return c


def _rlve(c):
  """cmd/games/train_fixed_rlve_*.sh (spade/core/fixed_env_orchestrator.py,
  spade/core/envs/rlve_adapter.py)."""
  c.train.mode = "adaptive"  # --spade-mode fixed_env
  c.train.family = "rlve"  # --spade-fixed-env-source rlve:<16 official>
  # Rollout batch 256 over 16 plays per environment: all 16 every step, one
  # shared problem each (--spade-fixed-env-same-problem), its level drawn
  # afresh every step (--spade-game-regeneration-interval 1).
  c.designer.num_envs = 16
  c.agent.plays_per_iteration = 0  # a fixed 16 plays per environment
  c.agent.episodes_per_env = 16  # --spade-trajectories-per-game 16
  # --global-batch-size 256 (slime/fixed_env_rollout.py fills it with
  # copies drawn at random, ours round-robin, and trims to it).
  c.optim.global_batch_size = 256
  c.agent.play_hinted = False
  c.agent.temperature = 1.0  # --spade-actor-temperature 1.0
  # RLVE's verifier gets the whole reply (fixed_env_orchestrator.
  # _parse_action_passthrough); the program finds the \boxed{} itself.
  c.agent.action = "raw"
  # The first user turn is the reference's RLVE prompt as reset() returns
  # it (problem + "Please reason step by step, and put your final answer
  # within \boxed{}."), not wrapped again in the game template.
  c.agent.prompt_style = "system"
  c.regret.agent_advantage = "normalize"  # --spade-reward-normalization grpo
  # --spade-difficulty-tau-acc 0.9 --spade-difficulty-tau-num 128
  # --spade-difficulty-d-delta 4; RlveEnvironmentAdapter(max_difficulty=20).
  c.difficulty.tau_acc = 0.9
  c.difficulty.tau_num = 128
  c.difficulty.d_delta = 4
  c.difficulty.min_level = 0
  c.difficulty.max_level = 20
  c.regret.lp_gamma_fast = 0.35  # --spade-lp-gamma-fast (LP variant only)
  c.regret.lp_gamma_slow = 0.15  # --spade-lp-gamma-slow
  c.memory.enabled = False  # no designer, no archive
  c.grounding.enabled = False
  # The reference's play budget (ENV_STEP_TIMEOUT, 30 s to load and reset a
  # program and for a step()): a problem of level 20 is ~400 KB of source.
  c.sandbox.step_timeout_s = 30.0
  c.sandbox.call_timeout_s = 30.0


def _static_pool(c):
  """cmd/games/_train_fixed_gpt55.sh: the GPT-5.5 static pool."""
  c.train.mode = "fixed_pool"  # --spade-static-game-pool
  c.train.pool_draw = "without_replacement"  # --spade-no-replacement
  # --rollout-batch-size 24, --global-batch-size 192: 8 plays per game.
  c.designer.num_envs = 24
  c.agent.plays_per_iteration = 192
  c.agent.episodes_per_env = 8
  # --spade-game-regeneration-interval 0: never a regeneration step, so no
  # hinted plays; --spade-no-train-on-env-trajectories: no designer rows.
  c.agent.play_hinted = False
  c.agent.temperature = 0.6  # --spade-actor-temperature 0.6
  c.memory.enabled = False
  c.grounding.enabled = False


def _tool_use(c):
  """cmd/tool_use/_train_spade_blend.sh (TOOL_MODEL_SIZE=30b)."""
  # --spade-game-type tool_use with SPADE_MULTITURN_ENV_GEN=1: instructions
  # revealed one at a time; the six skills, all in every regeneration
  # (--spade-skills-per-regen unset: 0).
  c.designer.prompt_family = "tool_use_multi_turn"
  c.designer.tool_use_skills = (
      "API Orchestration",
      "Data Retrieval",
      "State Modification",
      "Error Recovery",
      "Tool Selection",
      "Multi-Step Workflows",
  )
  c.designer.skills_per_regen = 0
  c.designer.regeneration_interval = 8  # REGEN_INTERVAL=8
  # PROPOSER_DELAY=8 at REGEN_INTERVAL=8: the rows train at the next
  # regeneration rollout, one iteration after their window closes.
  c.optim.designer_delay = 1
  c.designer.max_new_tokens = 16384  # ENV_MAX_TOKENS (30b)
  c.designer.max_prompt_tokens = 32768 - 16384
  # The hint pass: value-free procedural hints for tool use
  # (spade.designer.design_prompts.hint_messages), 2,048 tokens.
  c.designer.hint_max_new_tokens = 2048  # HINT_MAX_TOKENS=2048
  c.designer.hint_temperature = 0.3
  c.grounding.max_words = 4000  # --spade-corpus-max-doc-tokens 4000
  c.grounding.seed = 42  # --spade-corpus-seed 42
  c.optim.kl_coef = 0.005  # --kl-loss-coef 0.005
  # SPADE_RESET_GATE=1: refuse a program whose success criteria raise on
  # the reset state at seeds 0, 1, 2 (envs/synthetic_game_env.py,
  # criteria_throw_at_reset).
  c.environments.reset_gate = True
  # --spade-use-env-validator: the designer audits each valid program.
  c.designer.audit = True
  # SPADE_MASK_MALFORMED_TOOLCALL=1: an unparsable <tool_call> is stepped
  # with no loss and a [FORMAT] note (orchestrator._play_tool_game_async).
  c.agent.mask_malformed_tool_calls = True
  # --spade-compact-filter: episodes not terminated carry no loss
  # (slime/spade_rollout.py).
  c.agent.compact_filter = True


def _tiny(c, variant):
  """The CPU twin: the tiny byte-level model, one short iteration; the
  variant's behaviour (mode, draw, family, rules) is kept."""
  tiny = config_lib.base_config()
  c.model = tiny.model
  c.checkpoint = tiny.checkpoint
  c.tokenizer = tiny.tokenizer
  c.num_iterations = 1
  c.designer.prompt_overflow = "cut_left"  # a byte model: the tail only
  c.optim.microbatch_rows = 0
  c.optim.learning_rate = 1e-5
  c.sandbox.num_sandboxes = 1
  c.agent.max_turns = 2
  c.agent.max_new_tokens = 16
  c.agent.max_context = 768
  if variant == "rlve":
    # All 16 environments, 2 plays each of their one problem.
    c.agent.episodes_per_env = 2
  elif variant == "static_pool":
    c.designer.num_envs = 2
    c.agent.plays_per_iteration = 4  # ceil(4 / 2) = 2 plays per game
    c.agent.episodes_per_env = 2
  else:
    c.designer.num_envs = 1
    c.designer.regeneration_interval = 2
    c.designer.max_new_tokens = 32
    c.designer.max_prompt_tokens = 512
    c.designer.max_attempts = 1
    c.designer.hint_max_new_tokens = 16
    c.designer.audit_max_new_tokens = 16  # the audit's verdict, not 16,384
    c.designer.use_seed_programs = True
    c.grounding.max_words = 60
    c.agent.plays_per_iteration = 2
    c.agent.episodes_per_env = 2
    c.agent.hint_episodes_per_env = 2
