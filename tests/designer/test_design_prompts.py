"""Designer prompt families, their example programs, repairs and hints."""

import difflib
import importlib.util
import json
import os
import re

from ml_collections import ConfigDict
import pytest

from spade import config as config_lib
from spade.designer import design_prompts
from spade.designer import examples
from spade.designer import extract
from spade.designer import skills
from spade.environments import library
from spade.model import tokenizer as tokenizer_lib
from spade.selfplay import state as state_lib
from spade.selfplay import engine as engine_lib


class _Doc:
  title = "bisect"
  text = "Binary search halves a sorted interval at every comparison."


@pytest.mark.parametrize("family", skills.FAMILIES)
def test_every_family_renders_with_skill_difficulty_and_example(family):
  skill = skills.skills_for(family)[-1]
  messages = design_prompts.designer_messages(
      None,
      family=family,
      skill=skill,
      difficulty="hard",
      seed=3,
      example="complete",
  )
  system, user = messages[0]["content"], messages[1]["content"]
  assert [m["role"] for m in messages] == ["system", "user"]
  assert skill in user
  assert "DIFFICULTY: hard" in user
  # No placeholder is left unfilled.
  assert not re.search(r"__[A-Z_]+__", user), re.findall(r"__[A-Z_]+__", user)
  # The complete example is shown, and it is what a reply is parsed to.
  assert examples.BY_FAMILY[family].strip() in user
  assert "Python code in a ```python block." in user[-400:]
  if family in skills.TOOL_FAMILIES:
    assert "ToolUseBaseEnv" in user and "tool-calling" in system
  else:
    assert "\\boxed{" in user and "game designer" in system


def _step_bodies(text):
  """The body lines of every `def step` in the text's ```python blocks."""
  bodies = []
  for block in re.findall(r"```python\n(.*?)```", text, re.S):
    lines = block.split("\n")
    for i, line in enumerate(lines):
      if line.strip().startswith("def step("):
        indent = len(line) - len(line.lstrip())
        body = []
        for later in lines[i + 1 :]:
          if later.strip() and len(later) - len(later.lstrip()) <= indent:
            break
          code = later.split("#", 1)[0].strip()
          if code:
            body.append(code)
        bodies.append(body)
  return bodies


def test_corpus_prompt_is_the_reference_skeleton_by_default():
  assert config_lib.base_config().designer.prompt_example == "skeleton"
  user = design_prompts.designer_messages(_Doc(), skill="Optimization")[1][
      "content"
  ]
  # Only the interface contract: its step() ends in `...`, nothing after it,
  # and no complete program (ours, or any with a docstring) is shown.
  (body,) = _step_bodies(user)
  assert body[-1] == "..." and "return" not in " ".join(body)
  assert user.count("```python\n") == 1 and "REFERENCE EXAMPLE" not in user
  assert examples.CORPUS_GAME.strip() not in user
  assert "VaultBinarySearchEnv" not in user
  assert user.endswith(
      "interaction steps.\n\nGenerate the complete Python code in a"
      " ```python block."
  )
  single = design_prompts.designer_messages(None, family="single_turn_game")
  assert "REFERENCE EXAMPLE" not in single[1]["content"]
  assert examples.SINGLE_TURN_GAME.strip() not in single[1]["content"]


def test_skeleton_max_turns_sets_what_step_reads():
  """Ours: the reference's skeletons never set self.max_turns, which their
  step() reads; "skeleton_max_turns" differs from them only there."""
  for doc, family in ((_Doc(), None), (None, "single_turn_game")):
    kw = dict(family=family) if family else {}
    ref = design_prompts.designer_messages(doc, **kw)[1]["content"]
    ours = design_prompts.designer_messages(
        doc, example="skeleton_max_turns", **kw
    )
    ours = ours[1]["content"]
    assert "self.max_turns = max_turns" not in ref
    assert "self.max_turns" in ref  # step() reads it
    diff = difflib.ndiff(ref.splitlines(), ours.splitlines())
    changed = [l for l in diff if l[:2] in ("+ ", "- ")]
    assert [(l[0], l[2:].strip()) for l in changed] == [
        ("+", "self.max_turns = max_turns"),
        ("+", "self.turn_count = 0"),
    ]


def test_complete_example_option_shows_a_whole_program():
  user = design_prompts.designer_messages(_Doc(), example="complete")[1][
      "content"
  ]
  assert examples.CORPUS_GAME.strip() in user
  skeleton, complete = _step_bodies(user)
  assert skeleton[-1] == "..."
  # The example's step() is a real body: it parses, updates and returns.
  assert "..." not in complete and len(complete) > 10
  assert sum(line.startswith("return") for line in complete) >= 3
  single = design_prompts.designer_messages(
      None, family="single_turn_game", example="complete"
  )[1]["content"]
  assert examples.SINGLE_TURN_GAME.strip() in single
  with pytest.raises(ValueError, match="prompt example"):
    design_prompts.designer_messages(None, example="sketch")


@pytest.mark.parametrize(
    "family", ["multi_turn_game", "tool_use", "tool_use_multi_turn"]
)
def test_reference_families_with_a_complete_example_keep_it(family):
  # The reference's own prompts for these families carry a whole program.
  for example in design_prompts.PROMPT_EXAMPLES:
    user = design_prompts.designer_messages(
        None, family=family, example=example
    )
    assert examples.BY_FAMILY[family].strip() in user[1]["content"]


def test_difficulty_changes_the_tool_use_prompt_and_corpus_steps():
  easy = design_prompts.designer_messages(
      None, family="tool_use", difficulty="easy"
  )
  hard = design_prompts.designer_messages(
      None, family="tool_use", difficulty="hard"
  )
  assert "1-2 tool calls needed" in easy[1]["content"]
  assert "4+ tool calls with dependencies" in hard[1]["content"]
  easy = design_prompts.designer_messages(_Doc(), difficulty="easy")[1][
      "content"
  ]
  hard = design_prompts.designer_messages(_Doc(), difficulty="hard")[1][
      "content"
  ]
  assert "need 2+ interaction steps" in easy
  assert "need 3+ interaction steps" in hard


def test_document_grounds_games_as_corpus_and_flavours_tool_use():
  for family in skills.GAME_FAMILIES:
    user = design_prompts.designer_messages(_Doc(), family=family)[1]["content"]
    assert "<REFERENCE_DOCUMENT>\n" + _Doc.text in user
    assert "INTERACTIVE, MULTI-TURN Python game" in user
  user = design_prompts.designer_messages(_Doc(), family="tool_use")[1][
      "content"
  ]
  assert "in the DOMAIN described by this document" in user
  assert _Doc.text in user
  user = design_prompts.designer_messages(_Doc(), family="tool_use_multi_turn")
  assert "<REFERENCE_SNIPPET>\n" + _Doc.text in user[1]["content"]
  # Without a document nothing refers to one.
  user = design_prompts.designer_messages(None)[1]["content"]
  assert "REFERENCE_DOCUMENT" not in user


def test_seed_picks_concept_ideas_deterministically():
  a = design_prompts.designer_messages(
      None, family="tool_use_multi_turn", seed=1
  )
  b = design_prompts.designer_messages(
      None, family="tool_use_multi_turn", seed=1
  )
  assert a == b
  texts = {
      design_prompts.designer_messages(
          None, family="tool_use_multi_turn", seed=s
      )[1]["content"]
      for s in range(8)
  }
  assert len(texts) > 1


def test_multi_turn_game_turn_budget():
  user = design_prompts.designer_messages(None, max_turns=8)[1]["content"]
  assert "at most 8 turns" in user and "roughly 4–6 turns" in user


def test_program_hint_is_asked_only_when_chosen():
  assert (
      "hint(self)" not in design_prompts.designer_messages(None)[1]["content"]
  )
  user = design_prompts.designer_messages(None, program_hint=True)[1]["content"]
  assert "hint(self) -> str" in user


def test_unknown_family_skill_or_difficulty_is_refused():
  with pytest.raises(ValueError, match="family"):
    design_prompts.designer_messages(None, family="poetry")
  with pytest.raises(ValueError, match="skill"):
    design_prompts.designer_messages(
        None, family="tool_use", skill="Optimization"
    )
  with pytest.raises(ValueError, match="difficulty"):
    design_prompts.designer_messages(None, difficulty="brutal")


def test_parent_is_shown_for_mutation():
  class Parent:
    code = "class ParentEnv:\n    pass"
    stats = {"regret": 0.5}
    verdict = {"valid": True}

  user = design_prompts.designer_messages(None, parent=Parent())[1]["content"]
  assert "harder variant" in user and "class ParentEnv" in user


def test_pick_prompt_follows_the_reference_rotation():
  c = config_lib.base_config().designer
  assert c.prompt_family == "multi_turn_game"
  assert tuple(c.skills) == skills.REFERENCE_SKILLS
  assert tuple(c.difficulties) == ("medium",)
  picks = [
      design_prompts.pick_prompt(c, iteration=0, index=i, seed=7)
      for i in range(4)
  ]
  # Three active skills in epoch 0, cycled over the prompts.
  assert [p.skill for p in picks] == [
      "Mathematical Reasoning",
      "Logical Deduction",
      "Spatial Reasoning",
      "Mathematical Reasoning",
  ]
  assert {p.difficulty for p in picks} == {"medium"}
  assert picks == [
      design_prompts.pick_prompt(c, iteration=0, index=i, seed=7)
      for i in range(4)
  ]
  # The window moves once per regeneration epoch.
  later = design_prompts.pick_prompt(
      c, iteration=4, index=0, seed=7, regen_interval=4
  )
  assert later.skill == "Pattern Recognition"
  same = design_prompts.pick_prompt(
      c, iteration=3, index=0, seed=7, regen_interval=4
  )
  assert same.skill == "Mathematical Reasoning"
  # The pick feeds designer_messages directly.
  spec = picks[1]
  user = design_prompts.designer_messages(
      None,
      family=spec.family,
      skill=spec.skill,
      difficulty=spec.difficulty,
      seed=spec.seed,
  )[1]["content"]
  assert "tests: Logical Deduction" in user


def test_pick_prompt_draws_difficulties_and_tool_skills():
  c = ConfigDict(
      dict(
          prompt_family="tool_use",
          skills=skills.REFERENCE_SKILLS,
          tool_use_skills=("Error Recovery", "Tool Selection"),
          skills_per_regen=0,
          difficulties=("easy", "hard"),
      )
  )
  picks = [
      design_prompts.pick_prompt(c, iteration=2, index=i, seed=0)
      for i in range(16)
  ]
  assert {p.skill for p in picks} == {"Error Recovery", "Tool Selection"}
  assert {p.difficulty for p in picks} == {"easy", "hard"}
  c.tool_use_skills = ("Optimization",)
  with pytest.raises(ValueError, match="not skills"):
    design_prompts.pick_prompt(c, iteration=0, index=0, seed=0)


def test_config_validates_designer_choices():
  c = config_lib.base_config()
  assert c.designer.hint_source == "writer"
  assert c.designer.hint_max_new_tokens == 4096
  c.designer.prompt_family = "poetry"
  with pytest.raises(config_lib.ConfigError, match="prompt_family"):
    config_lib.validate(c)
  c = config_lib.base_config()
  c.designer.prompt_example = "complete"
  config_lib.validate(c)
  c.designer.prompt_example = "sketch"
  with pytest.raises(config_lib.ConfigError, match="prompt_example"):
    config_lib.validate(c)


def test_repair_messages_carry_the_code_and_the_error():
  history = design_prompts.designer_messages(None)
  code = "class BrokenEnv:\n    def reset(self, seed=None):\n        return 1\n"
  error = "reset: reset() must return (str, dict), got int"
  messages = design_prompts.repair_messages(code, error, history)
  assert messages[: len(history)] == history
  assert messages[-2] == {
      "role": "assistant",
      "content": "```python\n" + code.rstrip() + "\n```",
  }
  assert messages[-1]["role"] == "user"
  assert error in messages[-1]["content"]
  assert "COMPLETE, corrected version" in messages[-1]["content"]
  alone = design_prompts.repair_messages(code, error)
  assert [m["role"] for m in alone] == ["system", "user"]
  assert "class BrokenEnv" in alone[1]["content"]
  assert error in alone[1]["content"]


def test_hint_messages_carry_anti_leak_rules_and_the_code():
  game = examples.MULTI_TURN_GAME
  messages = design_prompts.hint_messages(game)
  assert "Do NOT reveal the exact answer" in messages[0]["content"]
  assert "Output ONLY the hint text" in messages[0]["content"]
  assert game in messages[1]["content"]
  tool = examples.TOOL_USE_MULTI_TURN
  messages = design_prompts.hint_messages(tool)
  system = messages[0]["content"]
  assert "NEVER write concrete data values" in system
  assert "Do NOT emit a complete, copy-pasteable" in system
  assert tool in messages[1]["content"]
  assert (
      design_prompts.hint_messages(game, tool_use=True)[0]["content"] == system
  )
  short = design_prompts.hint_messages(game, max_code_chars=100)[1]["content"]
  assert game[:100] in short and game[:101] not in short


def test_example_programs_validate_in_the_sandbox():
  from spade.environments import sandboxes  # pylint: disable=g-import-not-at-top

  codes = [examples.BY_FAMILY[f] for f in skills.FAMILIES]
  # Each example must be exactly what the designer's reply is parsed into.
  for f, code in zip(skills.FAMILIES, codes):
    user = design_prompts.designer_messages(None, family=f, example="complete")
    user = user[1]["content"]
    block = user[user.index(code.strip()) - len("```python\n") :]
    assert extract.extract_code(block).strip() == code.strip()
  sandbox = config_lib.base_config().sandbox
  sandbox.num_sandboxes = 1
  sandbox.warm_spare = False
  # A loaded machine can slow the first math_verify call of the single-turn
  # example past the default per-call budget; validity is what is checked.
  if "call_timeout_s" in sandbox:
    sandbox.call_timeout_s = 5.0
  with sandboxes.from_config(sandbox) as pool:
    verdicts = pool.validate(codes)
  for family, verdict in zip(skills.FAMILIES, verdicts):
    assert verdict["valid"], (family, verdict.get("reason"), verdict)


def _validity_benchmark():
  """benchmarks/designer_validity.py as a module."""
  path = os.path.join(
      os.path.dirname(__file__),
      "..",
      "..",
      "benchmarks",
      "designer_validity.py",
  )
  spec = importlib.util.spec_from_file_location("_designer_validity", path)
  bench = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(bench)
  return bench


_FRESH = (
    """
import random


class ParityWalkEnv:
    \"\"\"Walk a counter to an even target by steps of 3 or 5.\"\"\"

    def __init__(self, max_turns=8, **kwargs):
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.pos, self.goal, self.turns = 0, 2 * self.rng.randint(4, 9), 0
        return f"At {self.pos}; reach {self.goal} with +3 or +5.", {}

    def step(self, action):
        self.turns += 1
        self.pos += 5 if "5" in action else 3
        won = self.pos == self.goal
        done = won or self.pos > self.goal or self.turns >= self.max_turns
        return f"At {self.pos}.", float(won), done, False, {}
""",
    """
class LetterTallyEnv:
    \"\"\"Count the vowels of a word list, one word a turn.\"\"\"

    WORDS = ("banana", "kiwi", "quince", "apricot", "plum")

    def __init__(self, max_turns=6, **kwargs):
        self.limit = max_turns
        self.reset()

    def reset(self, seed=None):
        self.index, self.total = 0, 0
        return "Say how many vowels: " + self.WORDS[0], {}

    def step(self, action):
        word = self.WORDS[self.index]
        right = action.strip() == str(sum(ch in "aeiou" for ch in word))
        self.index += 1
        over = self.index >= len(self.WORDS) or self.index >= self.limit
        if over:
            return "Done.", float(right), True, False, {}
        return "Next: " + self.WORDS[self.index], 0.0, False, False, {}
""",
)


def test_validity_benchmark_builds_the_loop_prompts():
  bench = _validity_benchmark()
  config = bench._load_config("configs/tiny.py")  # pylint: disable=protected-access
  renderer = engine_lib.PromptRenderer(config, tokenizer_lib.ByteTokenizer())
  state = state_lib.LoopState.create(config)
  items = bench.designer_prompts_for(config, renderer, state, 3, 0, 0)
  assert len(items) == 3
  for ids, spec_, doc, shown in items:
    assert doc is not None and shown == ()
    assert design_prompts.effective_family(spec_.family, doc) == "corpus_game"
    assert len(ids) <= renderer.prompt_budget("designer")
  # memory.seed_dir: the reference's retrieval shows two seed programs of
  # the prompt's skill, as the loop's prompts do.
  config = bench._load_config(  # pylint: disable=protected-access
      "configs/tiny.py",
      ["memory.seed_dir=library", "grounding.enabled=False"],
  )
  config.model.max_len = config.designer.max_prompt_tokens = 1 << 16
  renderer = engine_lib.PromptRenderer(config, tokenizer_lib.ByteTokenizer())
  state = state_lib.LoopState.create(config)
  items = bench.designer_prompts_for(config, renderer, state, 2, 0, 0)
  assert [d for _, _, d, _ in items] == [None, None]
  for ids, spec_, _, shown in items:
    assert len(shown) == 2
    assert all(e.skill == spec_.skill for e in shown)
    text = bytes(i for i in ids if i < 256).decode("utf-8", "replace")
    assert "<REFERENCE_ENVIRONMENTS>" in text
    assert shown[0].code[-300:] in text


def test_validity_benchmark_overrides_refuse_unknown_keys():
  bench = _validity_benchmark()
  config = bench._load_config(  # pylint: disable=protected-access
      "configs/tiny.py", ["designer.max_attempts=3", "memory.seed_dir=x"]
  )
  assert config.designer.max_attempts == 3
  assert config.memory.seed_dir == "x"
  with pytest.raises(SystemExit, match="no key"):
    bench._load_config("configs/tiny.py", ["designer.nope=1"])  # pylint: disable=protected-access


def test_validity_benchmark_counts_copies_of_what_the_model_saw():
  bench = _validity_benchmark()
  config = bench._load_config("configs/tiny.py")  # pylint: disable=protected-access
  shown = bench.shown_programs(config)
  # The 0.5B model's edit of the corpus example: two names imported more,
  # an attribute dropped, a class renamed.
  copy = (
      examples.CORPUS_GAME.replace(
          "import random\nimport re\n", "import random, re, math, time\n"
      )
      .replace("        self.turn_count = 0\n", "")
      .replace("VaultBinarySearchEnv", "DescriptiveInteractiveEnv")
  )
  # A seed-library program is one the model is shown (memory.seed_dir) or
  # warm-started on: a renamed copy is a near-copy, not a distinct design.
  seed = library.seed_programs()[0].source.replace("Env", "GameEnv")
  designs = [copy, seed, _FRESH[0], _FRESH[0], _FRESH[1]]
  assert bench.novelty(designs, shown, 0.85) == (2, 2)
  verdicts = [{"valid": True}, {"valid": False}, {"valid": True}]
  assert bench.summary([copy, "x", _FRESH[0]], verdicts, shown, 0.85) == (
      "designs=3 valid=2 valid_frac=0.667 near_copies=1 distinct_valid=1"
  )


def test_validity_benchmark_rescores_a_stopped_run(tmp_path, capsys):
  # A run saves each design as it finishes, so a stopped one leaves gaps
  # (here designs 0 and 5 of 32): --rescore counts what is there.
  bench = _validity_benchmark()
  config = bench._load_config("configs/tiny.py")  # pylint: disable=protected-access
  for k, code, valid in ((0, _FRESH[0], True), (5, "def (", False)):
    (tmp_path / f"design_{k:02d}.py").write_text(code)
    (tmp_path / f"design_{k:02d}.json").write_text(json.dumps({"valid": valid}))
  bench.rescore(config, str(tmp_path))
  assert capsys.readouterr().out.strip() == (
      "designs=2 valid=1 valid_frac=0.500 near_copies=0 distinct_valid=1"
  )
  with pytest.raises(SystemExit, match="no design_"):
    bench.rescore(config, str(tmp_path / "absent"))
