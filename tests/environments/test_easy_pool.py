"""The easy pool (configs/qwen2p5_coder_0p5b.py:agent_curve): valid programs
whose solutions win on every seed, whose answers a careless policy gets
wrong, and where a policy that ignores the feedback still wins sometimes."""

import glob
import os
import random

import pytest

from spade import environments
from spade.environments import runtime
from spade.environments import validator

POOL = os.path.join(os.path.dirname(environments.__file__), "pools", "easy")
FILES = sorted(glob.glob(os.path.join(POOL, "*.py")))


def _source(path):
  with open(path) as f:
    return f.read()


def test_the_pool_has_its_three_games():
  names = [os.path.basename(f)[:-3] for f in FILES]
  assert names == ["add_numbers", "count_letter", "higher_lower"]


@pytest.mark.parametrize("path", FILES, ids=os.path.basename)
def test_valid_and_solved_on_every_seed(path):
  v = validator.validate_program(_source(path))
  assert v["valid"] and v["has_hint"] and v["solution_replayed"], v
  env_class = runtime.load_program(_source(path), "easy")
  for seed in range(50):
    env = env_class()
    env.reset(seed=seed)
    reward, done = 0.0, False
    for action in env.solution():
      _, reward, terminated, truncated, _ = env.step(action)
      done = terminated or truncated
      if done:
        break
    assert done and reward == 1.0, (path, seed)


def _play(env_class, policy, seed):
  env = env_class()
  env.reset(seed=seed)
  for turn in range(env.max_turns):
    _, reward, terminated, truncated, _ = env.step(policy(turn))
    if terminated or truncated:
      return reward
  return 0.0


def test_blind_guessing_wins_sometimes_not_always():
  # Guesses that ignore "higher"/"lower" win about a quarter of the games;
  # halving the range (the solution) wins all of them.
  env_class = runtime.load_program(
      _source(os.path.join(POOL, "higher_lower.py")), "higher_lower"
  )
  rng = random.Random(0)
  wins = sum(
      _play(env_class, lambda t: f"\\boxed{{{rng.randint(1, 15)}}}", s)
      for s in range(400)
  )
  assert 0.15 < wins / 400 < 0.35, wins


@pytest.mark.parametrize("name", ["add_numbers", "count_letter"])
def test_wrong_or_unboxed_answers_lose(name):
  env_class = runtime.load_program(
      _source(os.path.join(POOL, f"{name}.py")), name
  )
  for seed in range(20):
    assert _play(env_class, lambda t: "\\boxed{0}", seed) == 0.0
    # The right number outside \boxed{} does not count.
    env = env_class()
    env.reset(seed=seed)
    (answer,) = env.solution()
    bare = answer[len("\\boxed{") : -1]
    assert _play(env_class, lambda t, b=bare: b, seed) == 0.0
