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
"""

import importlib.util
import os


def _base(name: str):
  """A sibling config module, loaded by path (works from any directory)."""
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".py")
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def get_config(arg=None):
  """The recipe; `arg="runlocal"` shrinks its sizes to a CPU run."""
  if arg not in (None, "", "runlocal"):
    raise ValueError(
        f"configs/reference_recipe.py has no variant {arg!r} (try 'runlocal')"
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
  c.sampling.top_p = 0.95  # actor_top_p / env_top_p
  c.sampling.top_k = 20  # actor_top_k / env_top_k
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
  # The window already delays the designer's rows to its end (4 rollouts,
  # --spade-proposer-training-delay 4).
  c.optim.designer_delay = 0
  if arg == "runlocal":
    c.num_iterations = 4
    c.model.max_len = 2048
    c.designer.num_envs = 2
    c.designer.regeneration_interval = 2
    c.designer.max_new_tokens = 1536
    c.designer.max_prompt_tokens = 1536
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
