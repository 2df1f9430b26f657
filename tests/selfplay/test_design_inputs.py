"""What a design starts from: the seeded memory and the prompt budget."""

import pytest

from configs import tiny
from spade import config as config_lib
from spade.environments import library
from spade.memory import fifo
from spade.model import tokenizer as tokenizer_lib
from spade.selfplay import state as state_lib
from spade.selfplay import design
from spade.selfplay import engine as engine_lib


def _renderer(config):
  return engine_lib.PromptRenderer(config, tokenizer_lib.ByteTokenizer())


def test_library_seeds_are_training_programs_under_their_skill():
  seeds = state_lib.seed_programs("library")
  heldout = {p.name for p in library.heldout_programs()}
  assert len(seeds) == 17 and not heldout & {n for n, _, _ in seeds}
  by_name = {n: s for n, s, _ in seeds}
  assert by_name["grid_maze"] == "Spatial Reasoning"
  assert by_name["knapsack"] == "Optimization"
  assert "hangman" not in by_name  # language: no game skill
  state = state_lib.LoopState.create(_config(seed_dir="library"))
  assert len(state.fifo) == 17
  shown = state.examples(None, 2, "Spatial Reasoning")
  assert {e.name for e in shown} <= {"grid_maze", "sliding_puzzle"}
  assert len(shown) == 2


def test_a_seed_folder_is_shown_to_every_skill_and_checked(tmp_path):
  (tmp_path / "a.py").write_text("class CoinEnv:\n  pass\n")
  (tmp_path / "notes.txt").write_text("not a program")
  assert state_lib.seed_programs(str(tmp_path)) == [
      ("a", fifo.ANY_SKILL, "class CoinEnv:\n  pass\n")
  ]
  (tmp_path / "b.py").write_text("class Broken(:\n")
  with pytest.raises(ValueError, match="b.py does not parse"):
    state_lib.seed_programs(str(tmp_path))
  (tmp_path / "b.py").write_text("x = 1\n")
  with pytest.raises(ValueError, match="b.py defines no class"):
    state_lib.seed_programs(str(tmp_path))
  with pytest.raises(ValueError, match="is not a folder"):
    state_lib.seed_programs(str(tmp_path / "missing"))


def _config(**memory):
  c = tiny.get_config()
  c.memory.update(memory)
  return c


def test_a_budget_that_would_cut_the_instructions_is_refused():
  c = _config()
  c.designer.prompt_overflow = "refuse"
  # The byte model's instructions take thousands of bytes; tiny's budget
  # is 512.
  with pytest.raises(
      config_lib.ConfigError, match="designer.max_prompt_tokens=512"
  ):
    design.check_prompt_budget(c, _renderer(c))
  c.designer.prompt_overflow = "cut_left"
  design.check_prompt_budget(c, _renderer(c))  # tiny's choice
  c.designer.prompt_overflow = "refuse"
  c.model.max_len = 1 << 15
  c.designer.max_prompt_tokens = 1 << 14
  design.check_prompt_budget(c, _renderer(c))
