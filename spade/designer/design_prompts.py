"""Prompts for the designer role: environment programs, repairs and hints.

The prompt families are the reference implementation's (`spade-rl/spade`,
`spade/core/prompts/`), each conditioned on a skill and a difficulty the way
its orchestrator does it (`_build_env_gen_prompt`):

  single_turn_game     one puzzle per episode, answered in \\boxed{...}
  multi_turn_game      a world whose state changes with every \\boxed{move}
                       (the reference's games recipe,
                       `qwen3_multiturn_game_generation`)
  corpus_game          an interactive game grounded in a document; any game
                       family given a document becomes this one, as in the
                       reference's corpus orchestrator
  tool_use             a `ToolUseBaseEnv` task solved with tool calls
  tool_use_multi_turn  the same with instructions revealed one at a time
                       (BFCL-style); a document flavours both tool families

The families, skills and their descriptions are data (`spade.designer.
skills`); the texts are the reference's (`spade.designer.templates`). As in
the reference, the single-turn and corpus-grounded prompts show an interface
skeleton with `...` bodies, the multi-turn and tool-use ones a complete
example program; `example="complete"` (`designer.prompt_example`, ours)
shows a complete program (`spade.designer.examples`) in every family. Memory
examples are appended as the reference's
`_augment_prompt_with_memory` does (high-regret programs as models, rejected
ones as mistakes to avoid), then optionally a parent to mutate. Hints are
written in a separate pass (`hint_messages`, the reference's
`hint_generator.py`) under rules against leaking the answer; a program's own
`hint()` is asked for only with `program_hint=True` (`designer.hint_source =
"program"`). `pick_prompt` chooses (family, skill, difficulty) for prompt i
of an iteration deterministically.
"""

from __future__ import annotations

import random
from typing import Any, NamedTuple, Sequence

from spade.designer import examples as examples_lib
from spade.designer import skills as skills_lib
from spade.designer import templates

_SYSTEM = {
    "single_turn_game": templates.GAME_SYSTEM,
    "multi_turn_game": templates.MULTITURN_GAME_SYSTEM,
    # The recipe renders corpus prompts with its multi-turn template.
    "corpus_game": templates.MULTITURN_GAME_SYSTEM,
    "tool_use": templates.TOOL_USE_SYSTEM,
    "tool_use_multi_turn": templates.TOOL_USE_SYSTEM,
}
# Kept for callers that name the designer's system prompt directly.
DESIGNER_SYSTEM = templates.MULTITURN_GAME_SYSTEM

# designer.prompt_example: "skeleton" (the reference: the single-turn and
# corpus-grounded prompts show an interface skeleton with `...` bodies, the
# others the reference's own complete example), "skeleton_max_turns" (ours:
# the same skeleton whose `__init__` sets `self.max_turns` and
# `self.turn_count`, which its `step()` reads: the reference's skeleton
# never sets them, so a literal copy fails on the first step) or
# "complete" (ours: every family shows a complete example program).
PROMPT_EXAMPLES = ("skeleton", "skeleton_max_turns", "complete")
# The two skeletons' `__init__` as the reference writes them, and as
# "skeleton_max_turns" writes them.
_SKELETON_INIT = {
    "single_turn_game": (
        "    def __init__(self, max_turns=10, **kwargs):\n        ...\n",
        "    def __init__(self, max_turns=10, **kwargs):\n"
        "        self.max_turns = max_turns\n"
        "        self.turn_count = 0\n"
        "        ...\n",
    ),
    "corpus_game": (
        "    def __init__(self, max_turns=12, **kwargs):\n",
        "    def __init__(self, max_turns=12, **kwargs):\n"
        "        self.max_turns = max_turns\n"
        "        self.turn_count = 0\n",
    ),
}
DEFAULT_PROMPT_EXAMPLE = "skeleton"
_EXAMPLE_BLOCK = {
    "single_turn_game": templates.SINGLE_TURN_EXAMPLE_BLOCK,
    "corpus_game": templates.CORPUS_EXAMPLE_BLOCK,
}

_TEMPLATE = {
    "single_turn_game": templates.SINGLE_TURN_GAME,
    "multi_turn_game": templates.MULTI_TURN_GAME,
    "corpus_game": templates.CORPUS_GAME,
    "tool_use": templates.TOOL_USE,
    "tool_use_multi_turn": templates.TOOL_USE_MULTI_TURN,
}

_PROGRAM_HINT_RULE = (
    "Also define hint(self) -> str: a privileged hint for the current episode"
    " (the key insight and the answer format, never the answer itself)."
)
_GENERATE_LINE = "Generate the complete Python code in a ```python block."


class PromptSpec(NamedTuple):
  """What one designer prompt asks for (see `pick_prompt`)."""

  family: str
  skill: str
  difficulty: str
  seed: int


def active_skills(
    skills: Sequence[str], epoch: int, skills_per_regen: int
) -> list[str]:
  """The reference's skill rotation (`select_active_skills`).

  Each regeneration epoch activates a window of `skills_per_regen` skills,
  advancing by that many each epoch; 0 or at least len(skills) keeps all.

  Args:
    skills: the configured skills, in order.
    epoch: the regeneration epoch (iteration // regeneration interval).
    skills_per_regen: the window's size.

  Returns:
    The skills active in this epoch.
  """
  n = len(skills)
  if skills_per_regen <= 0 or skills_per_regen >= n:
    return list(skills)
  start = (epoch * skills_per_regen) % n
  return [skills[(start + j) % n] for j in range(skills_per_regen)]


def pick_prompt(
    designer_config: Any,
    *,
    iteration: int,
    index: int,
    seed: int,
    regen_interval: int = 1,
) -> PromptSpec:
  """Chooses the family, skill and difficulty of one designer prompt.

  As the reference does it: skill i of an iteration is the i-th of the
  active skills, cycled (`skills[i % len(skills)]` over the window of
  `select_active_skills`); the difficulty is the configured one (drawn from
  `designer.difficulties` when several are listed). The draw and the returned
  prompt seed (which picks the concept ideas shown) depend only on
  (seed, iteration, index), so every process picks the same.

  Args:
    designer_config: `config.designer` (prompt_family, skills,
      tool_use_skills, skills_per_regen, difficulties).
    iteration: the loop iteration.
    index: the prompt's index within the iteration.
    seed: the run's seed.
    regen_interval: iterations per regeneration epoch (the skill window moves
      once an epoch).

  Returns:
    PromptSpec(family, skill, difficulty, seed).
  """
  family = designer_config.prompt_family
  skills_lib.check_family(family)
  if family in skills_lib.TOOL_FAMILIES:
    skills = tuple(designer_config.tool_use_skills)
  else:
    skills = tuple(designer_config.skills)
  known = skills_lib.skills_for(family)
  unknown = [s for s in skills if s not in known]
  if not skills or unknown:
    raise ValueError(
        f"designer skills {unknown or '(none)'} are not skills of the"
        f" {family!r} family; choose from {known}"
    )
  difficulties = tuple(designer_config.difficulties)
  bad = [d for d in difficulties if d not in skills_lib.DIFFICULTIES]
  if not difficulties or bad:
    raise ValueError(
        f"designer.difficulties {difficulties!r}: each must be one of"
        f" {skills_lib.DIFFICULTIES}"
    )
  epoch = iteration // max(1, regen_interval)
  active = active_skills(skills, epoch, designer_config.skills_per_regen)
  rng = random.Random(f"{seed}/{iteration}/{index}")
  prompt_seed = rng.randrange(2**31)
  return PromptSpec(
      family=family,
      skill=active[index % len(active)],
      difficulty=rng.choice(difficulties),
      seed=prompt_seed,
  )


def _bullets(items: Sequence[str], prefix: str) -> str:
  return "\n".join(f"{prefix}{item}" for item in items)


def _family_prompt(
    family: str,
    skill: str,
    difficulty: str,
    rng: random.Random,
    document_text: str | None,
    max_turns: int,
    example: str,
) -> str:
  """One family's user prompt, as the reference's generator renders it."""
  block = _EXAMPLE_BLOCK.get(family, "") if example == "complete" else ""
  text = _TEMPLATE[family].replace("__EXAMPLE_BLOCK__", block)
  if example == "skeleton_max_turns" and family in _SKELETON_INIT:
    reference_init, ours = _SKELETON_INIT[family]
    if text.count(reference_init) != 1:
      raise AssertionError(f"the {family} skeleton's __init__ moved")
    text = text.replace(reference_init, ours)
  text = text.replace(
      "__EXAMPLE__", examples_lib.BY_FAMILY[family].rstrip("\n") + "\n"
  )
  if family in skills_lib.TOOL_FAMILIES:
    category, description, ideas = skills_lib.TOOL_USE_SKILLS[skill]
  else:
    description, ideas = skills_lib.COGNITIVE_SKILLS[skill]
    category = ""
  ideas = list(ideas)
  if family == "single_turn_game":
    if len(ideas) > 4:
      ideas = rng.sample(ideas, 4)
    text = text.replace("__EXAMPLES__", "  " + ", ".join(ideas))
  elif family == "multi_turn_game":
    ideas = list(skills_lib.MULTITURN_SKILL_EXAMPLES.get(skill, ideas))
    if len(ideas) > 3:
      ideas = rng.sample(ideas, 3)
    text = text.replace("__EXAMPLES__", _bullets(ideas, "  - "))
    text = text.replace("__MAX_TURNS__", str(max_turns))
    text = text.replace("__OPT_LO__", str(max_turns // 2))
    text = text.replace("__OPT_HI__", str(max_turns * 3 // 4))
  elif family == "corpus_game":
    text = text.replace("__DOCUMENT__", document_text or "")
    text = text.replace("__STEPS__", "2" if difficulty == "easy" else "3")
  elif family == "tool_use":
    if len(ideas) > 4:
      ideas = rng.sample(ideas, 4)
    text = text.replace("__EXAMPLES__", _bullets(ideas, "  - "))
    text = text.replace(
        "__DIFFICULTY_TEXT__",
        skills_lib.TOOL_USE_DIFFICULTY.get(
            difficulty, skills_lib.TOOL_USE_DIFFICULTY["hard"]
        ),
    )
    corpus = ""
    if document_text:
      corpus = (
          "You are given a reference document. Create a tool-use"
          " environment\nin the DOMAIN described by this document.\n\n"
          f"<REFERENCE_DOCUMENT>\n{document_text}\n</REFERENCE_DOCUMENT>\n\n"
          "GROUNDING REQUIREMENTS:\n"
          "- Tools and data must relate to the document's domain.\n"
          "- The game must be SELF-CONTAINED: the agent will NOT see the"
          " document.\n"
          "- NEVER reference the source document in game text.\n\n"
      )
    text = text.replace("__CORPUS_SECTION__", corpus)
  else:  # tool_use_multi_turn
    if len(ideas) > 4:
      ideas = rng.sample(ideas, 4)
    text = text.replace("__EXAMPLES__", _bullets(ideas, "  - "))
    corpus = ""
    if document_text:
      corpus = (
          "OPTIONAL FLAVOR (you MAY borrow surface names/numbers/entities"
          " from this\nsnippet, but the DOMAIN above is fixed - do NOT make"
          " the task about this\nsnippet, and never reference it in user"
          " messages):\n"
          f"<REFERENCE_SNIPPET>\n{document_text}\n</REFERENCE_SNIPPET>\n"
      )
    domain = rng.choice(skills_lib.TOOL_USE_DOMAINS)
    task_type = rng.choice(skills_lib.TASK_TYPE_ROTATION)
    text = text.replace("__SKILL_CATEGORY__", category)
    text = text.replace(
        "__DOMAIN_BLOCK__",
        skills_lib.DOMAIN_BLOCK.replace("__DOMAIN__", domain),
    )
    text = text.replace(
        "__TASK_TYPE_BLOCK__", skills_lib.TASK_TYPE_BLOCKS[task_type]
    )
    text = text.replace("__CORPUS_SECTION__", corpus)
  text = text.replace("__SKILL_NAME__", skill)
  text = text.replace("__SKILL_DESCRIPTION__", description)
  return text.replace("__DIFFICULTY__", difficulty)


def _stat(example: Any, name: str) -> float | None:
  stats = getattr(example, "stats", None) or {}
  value = stats.get(name)
  return value if isinstance(value, (int, float)) else None


def _reference_block(i: int, example: Any) -> str:
  """A high-regret archived environment, formatted as the reference does."""
  win = _stat(example, "win_rate_nohint")
  regret = _stat(example, "regret")
  fields = [f"skill: {s}" for s in [getattr(example, "skill", None)] if s]
  if win is not None:
    fields.append(f"win_rate: {win:.2f}")
  if regret is not None:
    fields.append(f"regret: {regret:.2f}")
  code = getattr(example, "code", str(example))
  head = f"### Example {i}" + (f" ({', '.join(fields)})" if fields else "")
  return f"{head}\n```python\n{code.rstrip()}\n```"


def _class_name(code: str) -> str:
  for line in code.splitlines():
    if line.startswith("class ") and "Env" in line:
      return line[len("class ") :].split("(")[0].split(":")[0].strip()
  return "(unnamed)"


def _negative_line(example: Any) -> str:
  """A rejected or badly calibrated environment, as a mistake to avoid."""
  code = getattr(example, "code", str(example))
  verdict = getattr(example, "verdict", None) or {}
  if not verdict.get("valid", True):
    message = " ".join(str(verdict.get("message", "")).split())[:300]
    return (
        f"- rejected by validation ({verdict.get('reason')}: {message}):"
        f" class {_class_name(code)}"
    )
  win = _stat(example, "win_rate_nohint") or 0.0
  reason = "too easy" if win > 0.9 else "too hard"
  # A memory record names itself (the reference prints its game file's
  # stem, env_memory.format_negative_examples); else the code's class.
  name = getattr(example, "name", None) or _class_name(code)
  return f"- {reason} (win_rate={win:.2f}): class {name}"


def _is_negative(example: Any) -> bool:
  # `spade.memory.fifo` says which pool a record was drawn from.
  if isinstance(getattr(example, "negative", None), bool):
    return example.negative
  verdict = getattr(example, "verdict", None) or {}
  if not verdict.get("valid", True):
    return True
  win = _stat(example, "win_rate_nohint")
  regret = _stat(example, "regret")
  # The reference's low-quality pool: played, and won almost always or
  # almost never, with no regret to show for it.
  return win is not None and (win > 0.9 or win < 0.1) and not regret


def effective_family(family: str | None, document: Any | None) -> str:
  """The family a prompt is rendered as: a document grounds a game family."""
  family = skills_lib.DEFAULT_FAMILY if family is None else family
  skills_lib.check_family(family)
  if family in skills_lib.GAME_FAMILIES and getattr(document, "text", None):
    return "corpus_game"
  return family


def designer_messages(
    document: Any | None,
    examples: Sequence[Any] = (),
    parent: Any | None = None,
    *,
    family: str | None = None,
    skill: str | None = None,
    difficulty: str | None = None,
    seed: int = 0,
    max_turns: int = 20,
    program_hint: bool = False,
    example: str = DEFAULT_PROMPT_EXAMPLE,
) -> list[dict[str, str]]:
  """Chat messages asking for one environment program.

  Args:
    document: a grounding document (`.text`, `.title`) or None when grounding
      is off. A game family given a document is rendered as `corpus_game`
      (the reference's corpus orchestrator); the tool families take it as
      their domain (tool_use) or flavour (tool_use_multi_turn).
    examples: archived environments to show (memory entries: `.code`,
      `.stats`, `.verdict`): valid ones as the reference's
      <REFERENCE_ENVIRONMENTS>, rejected or badly calibrated ones in its
      "Avoid generating environments like" list.
    parent: when set, an archived environment to edit into a harder variant
      (mutation).
    family: one of `FAMILIES`; None: `DEFAULT_FAMILY`, the games recipe's.
    skill: the targeted skill (`skills_for(family)`); None: the first
      reference skill of the family.
    difficulty: "easy", "medium" or "hard"; None: "medium".
    seed: picks the concept ideas (and, for tool_use_multi_turn, the domain
      and task variant) shown, as the reference draws them per call.
    max_turns: the turn budget the multi-turn game prompt designs for.
    program_hint: also ask for a `hint()` method (`designer.hint_source =
      "program"`); the reference writes hints in a separate pass instead.
    example: `designer.prompt_example`, one of `PROMPT_EXAMPLES`:
      "skeleton" (the reference) shows the single-turn and corpus-grounded
      prompts' interface skeleton only; "skeleton_max_turns" (ours) the
      same skeleton with an `__init__` that sets `self.max_turns` and
      `self.turn_count`; "complete" (ours) also shows a complete example
      program in them. The multi-turn and tool-use prompts
      show the reference's complete example either way.

  Returns:
    [{"role": "system", ...}, {"role": "user", ...}]
  """
  family = effective_family(family, document)
  text = getattr(document, "text", None) if document is not None else None
  if skill is None:
    skill = (
        skills_lib.REFERENCE_TOOL_USE_SKILLS[0]
        if family in skills_lib.TOOL_FAMILIES
        else skills_lib.REFERENCE_SKILLS[0]
    )
  if skill not in skills_lib.skills_for(family):
    raise ValueError(
        f"skill {skill!r} is not a skill of the {family!r} family; one of"
        f" {skills_lib.skills_for(family)}"
    )
  difficulty = (
      skills_lib.DEFAULT_DIFFICULTY if difficulty is None else difficulty
  )
  if difficulty not in skills_lib.DIFFICULTIES:
    raise ValueError(
        f"difficulty {difficulty!r} is not one of {skills_lib.DIFFICULTIES}"
    )
  if example not in PROMPT_EXAMPLES:
    raise ValueError(
        f"prompt example {example!r} is not one of {PROMPT_EXAMPLES}"
    )
  content = _family_prompt(
      family, skill, difficulty, random.Random(seed), text, max_turns, example
  )
  if program_hint:
    content = content.replace(
        _GENERATE_LINE, _PROGRAM_HINT_RULE + "\n\n" + _GENERATE_LINE
    )
  positives = [e for e in examples if not _is_negative(e)]
  negatives = [e for e in examples if _is_negative(e)]
  if positives:
    content += (
        "\n\n<REFERENCE_ENVIRONMENTS>\n"
        "Here are examples of effective training environments with "
        "good difficulty calibration. Use them as inspiration for "
        "structure and complexity, but create a DIFFERENT game:\n\n"
        + "\n\n".join(
            _reference_block(i, e) for i, e in enumerate(positives, 1)
        )
        + "\n</REFERENCE_ENVIRONMENTS>\n"
    )
  if negatives:
    content += (
        "\nAvoid generating environments like:\n"
        + "\n".join(_negative_line(e) for e in negatives)
        + "\n"
    )
  if parent is not None:
    content += (
        "\nEdit this environment into a harder variant of the same idea:\n"
        + _reference_block(1, parent).split("\n", 1)[1]
        + "\n"
    )
  if positives or negatives or parent is not None:
    # The reference ends on its memory block; a closing line keeps the
    # request last for models that follow the final instruction.
    content += "\n" + _GENERATE_LINE
  return [
      {"role": "system", "content": _SYSTEM[family]},
      {"role": "user", "content": content},
  ]


def repair_prompt(error: str) -> str:
  """The reference's `_repair_prompt`: a validation error to fix."""
  return (
      "The game code you wrote failed validation with this error:\n\n"
      f"    {error}\n\n"
      "Return a COMPLETE, corrected version of the game in a single "
      "```python code block. Fix the error, keep the same game idea, and "
      "ensure the class defines reset(seed=None) and step(action)."
  )


def repair_messages(
    code: str,
    verdict_message: str,
    history: Sequence[dict[str, str]] | None = None,
) -> list[dict[str, str]]:
  """Chat messages asking the designer to repair an invalid program.

  As the reference's repair turns: the conversation that produced the
  program, the program as the assistant's turn, then the validation error as
  the next user turn.

  Args:
    code: the program that failed validation.
    verdict_message: the validator's message (reason and detail).
    history: the designer messages that produced `code`; None: a system
      prompt and the code in the user turn.

  Returns:
    Chat messages ending with the user's repair request.
  """
  fenced = f"```python\n{code.rstrip()}\n```"
  if history:
    return list(history) + [
        {"role": "assistant", "content": fenced},
        {"role": "user", "content": repair_prompt(verdict_message)},
    ]
  return [
      {"role": "system", "content": DESIGNER_SYSTEM},
      {
          "role": "user",
          "content": (
              f"Here is a game you wrote:\n{fenced}\n\n"
              + repair_prompt(verdict_message)
          ),
      },
  ]


def is_tool_use(code: str) -> bool:
  """Whether a program is a tool-use environment (its hint prompt differs)."""
  return "ToolUseBaseEnv" in code or "def tool_" in code


def hint_messages(
    code: str,
    *,
    tool_use: bool | None = None,
    max_code_chars: int | None = None,
) -> list[dict[str, str]]:
  """Chat messages asking the model for a hint from an environment's code.

  The reference's separate hint pass (`hint_generator.py`): its system prompt
  for games, or its procedural, value-free one for tool use, then the code.

  Args:
    code: the environment's source.
    tool_use: pick the tool-use prompt; None: detect it from the code.
    max_code_chars: keep at most this many characters of the code (None: all
      of it, as the reference).

  Returns:
    [{"role": "system", ...}, {"role": "user", ...}]
  """
  if tool_use is None:
    tool_use = is_tool_use(code)
  if max_code_chars is not None:
    code = code[:max_code_chars]
  return [
      {
          "role": "system",
          "content": (
              templates.TOOL_USE_HINT_SYSTEM
              if tool_use
              else templates.HINT_SYSTEM
          ),
      },
      {"role": "user", "content": f"Environment code:\n```python\n{code}\n```"},
  ]
