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

Each prompt shows one complete, valid example program
(`spade.designer.examples`). Memory examples are appended as the reference's
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
from spade.designer import templates

FAMILIES = (
    "single_turn_game",
    "multi_turn_game",
    "corpus_game",
    "tool_use",
    "tool_use_multi_turn",
)
GAME_FAMILIES = ("single_turn_game", "multi_turn_game", "corpus_game")
TOOL_FAMILIES = ("tool_use", "tool_use_multi_turn")
DIFFICULTIES = ("easy", "medium", "hard")

# The reference's games recipe (cmd/games/train_spade_30b.sh): these six
# skills, three active per regeneration epoch, difficulty "medium".
REFERENCE_SKILLS = (
    "Mathematical Reasoning",
    "Logical Deduction",
    "Spatial Reasoning",
    "Pattern Recognition",
    "Optimization",
    "Causal Inference",
)
# spade/slime/spade_rollout.py: DEFAULT_SKILLS_TOOL_USE, the first two.
REFERENCE_TOOL_USE_SKILLS = ("API Orchestration", "Data Retrieval")
DEFAULT_FAMILY = "multi_turn_game"
DEFAULT_DIFFICULTY = "medium"

# System prompts of the reference's chat templates for each family.
GAME_SYSTEM = (
    "You are an expert Python programmer and game designer. You create"
    " educational language games for training Large Language Models."
)
MULTITURN_GAME_SYSTEM = (
    "You are an expert Python programmer and game designer specializing in "
    "interactive, multi-turn text-based games. You create environments where "
    "the player must make sequential decisions across multiple turns, with "
    "each action changing the game state."
)
TOOL_USE_SYSTEM = (
    "You are an expert API and tool-calling environment designer. "
    "You create structured tool-use task environments for training language "
    "models to call functions correctly. Each environment defines custom "
    "tools (search, filter, lookup, compute, etc.) and a task that requires "
    "calling these tools in the right sequence to arrive at an answer. "
    "The agent uses native tool calling via OpenAI-format tool schemas and "
    "submits its final answer with <answer>result</answer>."
)
_SYSTEM = {
    "single_turn_game": GAME_SYSTEM,
    "multi_turn_game": MULTITURN_GAME_SYSTEM,
    # The recipe renders corpus prompts with its multi-turn template.
    "corpus_game": MULTITURN_GAME_SYSTEM,
    "tool_use": TOOL_USE_SYSTEM,
    "tool_use_multi_turn": TOOL_USE_SYSTEM,
}
# Kept for callers that name the designer's system prompt directly.
DESIGNER_SYSTEM = MULTITURN_GAME_SYSTEM

_TEMPLATE = {
    "single_turn_game": templates.SINGLE_TURN_GAME,
    "multi_turn_game": templates.MULTI_TURN_GAME,
    "corpus_game": templates.CORPUS_GAME,
    "tool_use": templates.TOOL_USE,
    "tool_use_multi_turn": templates.TOOL_USE_MULTI_TURN,
}

# spade/core/game_generator.py: SyntheticGameGenerator.COGNITIVE_SKILLS,
# name -> (description, concept ideas).
COGNITIVE_SKILLS = {
    "Pattern Recognition": (
        "Identifying patterns in sequences, numbers, or text",
        (
            "Caesar/substitution cipher decoding",
            "matrix transformation rule discovery (what operation maps grid A"
            " to grid B?)",
            "regex pattern inference from string examples",
            "number base conversion patterns",
            "modular arithmetic cycles (clock arithmetic)",
            "sequence with hidden piecewise rules (different rules for"
            " odd/even indices)",
            "ASCII art pattern completion (rotate, reflect, tile)",
            "binary encoding/decoding puzzles",
            "function composition rule discovery (given input-output pairs,"
            " find the function)",
        ),
    ),
    "Logical Deduction": (
        "Drawing conclusions from given premises and rules",
        ("logic puzzles", "syllogism solving", "rule-based games"),
    ),
    "Strategic Planning": (
        "Multi-step planning and resource management",
        ("path planning", "resource allocation", "scheduling puzzles"),
    ),
    "Mathematical Reasoning": (
        "Solving mathematical problems and equations",
        (
            "system of nonlinear equations",
            "combinatorial counting with constraints (permutations,"
            " partitions)",
            "modular inverse / Chinese Remainder Theorem",
            "probability of compound events",
            "geometric area/volume with composite shapes",
            "integer partition or Diophantine equation problems",
            "graph-based shortest path or connectivity",
            "polynomial root finding or factoring",
            "expected value or conditional probability calculations",
            "cryptarithmetic (SEND + MORE = MONEY style)",
        ),
    ),
    "Spatial Reasoning": (
        "Understanding spatial relationships and mental rotation",
        ("grid navigation", "direction puzzles", "position tracking"),
    ),
    "Causal Inference": (
        "Understanding cause-effect relationships",
        ("cause-effect chains", "system dynamics", "prediction games"),
    ),
    "Memory Recall": (
        "Remembering and utilizing past information",
        ("memory games", "sequence recall", "information tracking"),
    ),
    "Optimization": (
        "Finding optimal solutions under constraints",
        ("knapsack problems", "scheduling optimization", "route planning"),
    ),
    "Language Understanding": (
        "Understanding and manipulating language",
        ("word puzzles", "anagrams", "riddles", "semantic games"),
    ),
}

# spade/core/prompts/template.py: _MULTITURN_SKILL_EXAMPLES.
MULTITURN_SKILL_EXAMPLES = {
    "Pattern Recognition": (
        "grid exploration where rooms contain pattern fragments — collect"
        " enough fragments to decode a message",
        "Mastermind: guess a hidden color code, get feedback (correct"
        " position, wrong position, absent)",
        "mine sweeper on a small grid — uncover cells, flag mines, use number"
        " clues to deduce safe cells",
        "decode a cipher by exploring a map — each location reveals a letter"
        " mapping",
    ),
    "Logical Deduction": (
        "detective investigation: interview suspects, search crime scenes,"
        " examine evidence, then accuse",
        "Clue/Cluedo: move between rooms, gather evidence cards, deduce"
        " who/what/where",
        "logic grid puzzle: ask yes/no questions to fill a constraint grid"
        " across turns",
        "escape room: examine objects in sequence, each reveals a clue for the"
        " next puzzle",
    ),
    "Mathematical Reasoning": (
        "balance a set of equations by adjusting coefficients across turns",
        "navigate a number maze — each cell has a math operation, choose path"
        " to reach target value",
        "auction game: bid on items with hidden values, manage budget to"
        " maximize total worth",
        "build a tower of blocks with weight constraints — choose placement"
        " order carefully",
    ),
    "Spatial Reasoning": (
        "navigate a 2D grid maze — find the exit while avoiding dead ends and"
        " traps",
        "Sokoban: push boxes onto target positions in a grid warehouse",
        "arrange furniture in rooms to satisfy spatial constraints (next to"
        " window, not blocking door)",
        "navigate a robot through obstacles — choose direction each turn,"
        " limited fuel",
    ),
    "Strategic Planning": (
        "tower defense: place 3 turrets on a grid, then simulate waves of"
        " enemies",
        "city builder: allocate budget across turns to build infrastructure"
        " and reach population target",
        "supply chain: route goods through a network, manage inventory at each"
        " node",
        "chess endgame: move pieces on a small board to reach checkmate",
    ),
    "Causal Inference": (
        "scientific experiment: choose which variables to test each turn,"
        " deduce the hidden causal rule",
        "troubleshooting: diagnose a broken machine by testing components in"
        " sequence",
        "epidemic simulation: choose interventions each turn, observe effects,"
        " find the transmission source",
        "circuit debugging: toggle switches and measure outputs to find the"
        " faulty gate",
    ),
    "Memory Recall": (
        "memory palace: visit rooms and memorize items, then answer recall"
        " questions at the end",
        "witness interview: hear testimony across turns, then spot"
        " contradictions to find the liar",
        "spy decoder: read intercepted messages across turns, then reconstruct"
        " the full secret",
        "shopping list: items are revealed one at a time — at the end, buy"
        " exactly what was listed",
    ),
    "Optimization": (
        "knapsack: items arrive one by one — decide to take or skip each to"
        " maximize value within weight limit",
        "scheduling: assign jobs to machines across turns to minimize total"
        " completion time",
        "portfolio: allocate investments each round with changing market"
        " conditions",
        "factory: configure production lines across turns to maximize output"
        " before deadline",
    ),
    "Language Understanding": (
        "text adventure: explore a mansion, read notes, interpret riddles to"
        " find hidden treasure",
        "translation puzzle: decode foreign phrases by exploring a village and"
        " talking to NPCs",
        "crossword builder: get clues across turns, fill in a word grid"
        " incrementally",
        "story detective: read chapters of a story across turns, answer"
        " comprehension questions to progress",
    ),
}

# spade/core/prompts/tool_use_template.py: TOOL_USE_SKILLS,
# name -> (category, description, example tasks).
TOOL_USE_SKILLS = {
    "API Orchestration": (
        "Stateful Operations",
        "Chain multiple tool calls that mutate state sequentially",
        (
            "Navigate to a directory, create a subdirectory, move files into"
            " it",
            "Check account balance, transfer funds, verify new balance",
            "Search inventory, reserve items, confirm reservation, generate"
            " invoice",
            "List available flights, book one, add passenger details, confirm"
            " booking",
        ),
    ),
    "Data Retrieval": (
        "Query Then Act",
        "First discover information via query tools, then act on it precisely",
        (
            "List directory contents, find target file, read its content,"
            " extract specific data",
            "Search for user by name, get their order history, find the most"
            " recent order",
            "Check current settings, identify which ones need change, update"
            " them",
            "Query database for records matching criteria, compute aggregate,"
            " report result",
        ),
    ),
    "State Modification": (
        "Mutation Chains",
        "Execute a sequence of state-changing operations where each depends"
        " on prior state",
        (
            "Create user account, set permissions, add to group, verify"
            " membership",
            "Navigate file tree, create directory structure, move and rename"
            " files",
            "Initialize vehicle systems (engine, doors, fuel), then execute"
            " driving commands",
            "Set up trading portfolio: check prices, place orders, verify"
            " positions",
        ),
    ),
    "Error Recovery": (
        "Robustness",
        "Handle tool failures, verify state before acting, retry with"
        " corrections",
        (
            "Try to move a file, handle 'not found' error, search for correct"
            " path, retry",
            "Attempt operation, detect permission error, elevate access, retry",
            "Check if directory exists before creating, handle 'already"
            " exists' gracefully",
            "Validate inputs by querying current state before calling"
            " destructive operation",
        ),
    ),
    "Tool Selection": (
        "Decision Making",
        "Choose correct tool from alternatives based on current state",
        (
            "Check current location first, then decide whether to navigate or"
            " act locally",
            "Query item type, then pick appropriate processing tool for that"
            " type",
            "Read file format, then choose correct parser/converter tool",
            "Check resource status, decide between create vs update operation",
        ),
    ),
    "Multi-Step Workflows": (
        "Sequential Planning",
        "Execute ordered sequences where later steps depend on results of"
        " earlier steps",
        (
            "File management: list → navigate → create dir → move files →"
            " verify → report",
            "Order processing: search catalog → check stock → reserve → pay →"
            " confirm → notify",
            "System setup: check status → configure → enable → test → verify →"
            " log result",
            "Data pipeline: connect → query → filter → transform → write →"
            " validate output",
        ),
    ),
}

# tool_use_template.py: TOOL_USE_DIFFICULTY (an unknown level reads "hard").
TOOL_USE_DIFFICULTY = {
    "easy": (
        "DIFFICULTY: easy\n"
        "- 1-2 tool calls needed. Single tool or simple two-step chain.\n"
        "- 3-4 total tools available (1 unused).\n"
        "- Answer derivable from one or two tool call results.\n"
    ),
    "medium": (
        "DIFFICULTY: medium\n"
        "- 2-4 tool calls needed. Must chain results across calls.\n"
        "- 4-6 total tools available (1-2 unused).\n"
        "- Answer requires combining information from multiple tool results.\n"
    ),
    "hard": (
        "DIFFICULTY: hard\n"
        "- 4+ tool calls with dependencies. Correct ordering matters.\n"
        "- 5-8 total tools available (2-3 unused).\n"
        "- Answer requires multi-step reasoning across chained tool outputs.\n"
        "- Include scenarios where one tool may return partial or paginated"
        " data.\n"
    ),
}

# tool_use_template.py: the multi-turn variant's domain and task-type
# rotation, one of each drawn per prompt.
TOOL_USE_DOMAINS = (
    "retail order management (orders, items, refunds, shipping)",
    "flight and hotel booking (search, reserve, pay, cancel)",
    "telecom account management (plans, lines, billing, data add-ons)",
    "personal banking and payments (accounts, transfers, cards, invoices)",
    "a calendar and reminders assistant (events, invites, reminders)",
    "a file system (files, folders, move/copy/search)",
    "an e-commerce shopping cart (catalog, cart, checkout, coupons)",
    "customer-support tickets / CRM (tickets, status, assignment, notes)",
    "smart-home device control (lights, thermostat, locks, scenes)",
    "a project / task tracker (tasks, assignees, status, due dates)",
)
_DOMAIN_BLOCK = (
    "REAL-WORLD DOMAIN (build the tools, state, and user goal for THIS domain;"
    " do NOT\nuse the reference snippet's academic subject as the domain):\n"
    "  __DOMAIN__\n"
    "The task must be a realistic user accomplishing a goal here (search,"
    " book, order,\nupdate, cancel, transfer, schedule), like tau2-bench /"
    " BFCL / ACEBench / VitaBench\ntasks - NOT an exam or puzzle about any"
    " document.\n"
)
TASK_TYPE_BLOCKS = {
    "execute": (
        "TASK VARIANT: execute (happy-path). The user issues atomic"
        " instructions; the\nagent calls the right tools in order. Each"
        " criterion checks the resulting state.\n(BFCL multi_turn_base /"
        " tau2-bench)\n"
    ),
    "read_then_write": (
        "TASK VARIANT: read_then_write. At least ONE instruction must force"
        " the agent to\nFIRST query state with a read tool, branch on a"
        " predicate over the result (e.g.\n'for every order over $100', 'all"
        " lines past their data cap'), THEN make the\ndependent write. Its"
        " criterion must check the final state reflects the\n"
        "predicate-conditioned writes - not merely that one tool was called.\n"
        "(MCP-Mark / MCP-Universe long-horizon CRUD)\n"
    ),
    "miss_param": (
        "TASK VARIANT: missing_value. At least ONE instruction references a"
        " value the user\ndoes NOT state (e.g. 'cancel my most recent order'"
        " with no order_id; 'pay the\noverdue invoice' with no invoice id). The"
        " agent must DISCOVER it via a read tool\nbefore the write. The write"
        " tool MUST return an error if given a wrong/guessed\nvalue, so a"
        " fabricated argument cannot satisfy the criterion.\n"
        "(BFCL multi_turn_miss_param / ACEBench incomplete)\n"
    ),
    "irrelevant": (
        "TASK VARIANT: with_irrelevant. Include EXACTLY ONE instruction that"
        " NONE of the\ndomain tools can satisfy (e.g. in a retail env, 'what"
        " will the weather be\ntomorrow?'). Add a tool named 'decline_request'"
        " (one required string param\n'reason') whose method sets a state flag"
        " and then advances; that instruction's\ncriterion is met ONLY by"
        " calling decline_request. Provide NO other tool that\ncould plausibly"
        " fulfill the irrelevant request.\n(BFCL irrelevance / ACEBench"
        " irrelevant)\n"
    ),
}
# Weighted as the reference's _TASK_TYPE_ROTATION.
TASK_TYPE_ROTATION = (
    ("execute",) * 3 + ("read_then_write",) * 2 + ("miss_param", "irrelevant")
)

# hint_generator.py: HINT_SYSTEM_PROMPT (games).
HINT_SYSTEM = """You are analyzing game source code to generate a solving hint for an LLM player.

CONTEXT: The player sees only text observations and responds with \\boxed{answer}. It CANNOT see the source code - only you can. Your hint will be appended to the player's first observation.

TASK: Read the code carefully. Identify:
1. What puzzle the game presents (from the player's perspective, not the code's)
2. How the correct answer is derived (trace through reset() and the checking logic in step())
3. What answer format is expected (a number, a word, a list, etc.)

WRITE a hint that includes:
- The key insight or strategy for solving this specific puzzle
- The expected answer format (e.g., "answer with a single integer", "answer with a comma-separated list")

RULES:
- Keep it to 1-3 sentences (under 100 words)
- Reference only what the player can SEE in the observation, not code internals
- Be specific to this game - no generic advice like "think carefully" or "consider all possibilities"
- Do NOT reveal the exact answer, but DO explain the approach

GOOD hint example: "The sequence follows a rule where each term is the sum of the two preceding terms. Count the pattern and predict the next value. Answer with a single integer."
BAD hint example: "The self.solution variable stores the answer computed in reset(). Try to think about what it could be."

Output ONLY the hint text. No JSON, no markdown, no labels."""

# hint_generator.py: TOOL_USE_HINT_SYSTEM_PROMPT.
TOOL_USE_HINT_SYSTEM = """You are analyzing a MULTI-TURN tool-use environment's source code to write a PROCEDURAL strategy hint for an LLM agent that will play it.

CONTEXT: The agent acts turn-by-turn. It sees ONE user instruction at a time, calls tools with <tool_call>{"name": "...", "arguments": {...}}</tool_call>, reads each tool result, and submits <answer>done</answer> ONLY after every instruction has been satisfied. It CANNOT see the source code - only you can. Your hint is appended to the agent's FIRST observation.

GOAL: The hint must help the agent get UNSTUCK without SOLVING the task for it. Summarize the approach (a lossy plan), never the answer. Discovering the specific values by calling tools is the SKILL being tested - a hint the agent can win by copy-pasting is worthless, and it trains the generator to make games that are unsolvable WITHOUT the leaked answer.

TASK: Read the code and identify the high-level STRATEGY only: which KINDS of tools/operations are involved, the general order of PHASES (which tool's output feeds the next), and which tools are distractors / out-of-scope.

WRITE a hint that:
- Describes the general approach and the order of PHASES in terms of tool ROLES (e.g. "first look up the relevant record, then update it, then organize the files") - NOT a fully filled-in call sequence.
- Tells the agent to act turn-by-turn and submit <answer>done</answer> ONLY after all steps are complete - never jump straight to a final answer.
- Tells the agent to DISCOVER the specific arguments by calling lookup/list tools and reading each user instruction - it must not assume them.
- If an instruction omits a required argument, say to ASK for it (do not guess); if a request is out of scope of the available tools, say to DECLINE.

HARD RULES (these prevent answer leakage - the #1 failure mode):
- NEVER write concrete data values read from the code or hidden state: no exact IDs, names, file names, paths, amounts, dates, or status strings. Use placeholders like <order_id>, <amount>, or phrases like "the order the user names". If you are about to type a specific value (e.g. 'ORD104', 'savings_67890', 'final_report.pdf'), replace it with a placeholder.
- Do NOT emit a complete, copy-pasteable call-by-call walkthrough with all arguments filled in.
- Reference only tool-level behavior the agent can observe - never reveal code internals (state-variable names, exact criteria expressions).
- Keep it to 2-3 sentences (under 100 words). Specific to THIS environment's tools/goal, but VALUE-FREE.
- Do NOT tell the agent to "answer with a single integer/word" or submit a final answer immediately. This is a multi-turn EXECUTION task.

GOOD hint (strategy + placeholders; the agent still must discover specifics):
"Work one instruction at a time. First use the order-lookup tool to find the order the user refers to, then the order-update tool to change its status; afterwards use the file tools to create the destination folder and move the named file into it. Read each tool result and the next instruction to get the exact arguments - don't assume IDs or paths. Submit <answer>done</answer> only after the final instruction is done."

BAD hint (LEAKS THE ANSWER - never do this): "call find_order(order_id='ORD104'), then update_order_status(order_id='ORD104', status='shipped'), then move_file(src='order_summary.txt', dst='/customer/orders/tracking'). Submit <answer>done</answer>." - it hardcodes exact IDs/paths so the agent wins by copying instead of doing the task.

Output ONLY the hint text. No JSON, no markdown, no labels."""

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


def skills_for(family: str) -> tuple[str, ...]:
  """The skills a family can be conditioned on."""
  _check_family(family)
  if family in TOOL_FAMILIES:
    return tuple(TOOL_USE_SKILLS)
  return tuple(COGNITIVE_SKILLS)


def _check_family(family: str) -> None:
  if family not in FAMILIES:
    raise ValueError(f"unknown prompt family {family!r}; one of {FAMILIES}")


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
  _check_family(family)
  if family in TOOL_FAMILIES:
    skills = tuple(designer_config.tool_use_skills)
  else:
    skills = tuple(designer_config.skills)
  known = skills_for(family)
  unknown = [s for s in skills if s not in known]
  if not skills or unknown:
    raise ValueError(
        f"designer skills {unknown or '(none)'} are not skills of the"
        f" {family!r} family; choose from {known}"
    )
  difficulties = tuple(designer_config.difficulties)
  bad = [d for d in difficulties if d not in DIFFICULTIES]
  if not difficulties or bad:
    raise ValueError(
        f"designer.difficulties {difficulties!r}: each must be one of"
        f" {DIFFICULTIES}"
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
) -> str:
  """One family's user prompt, as the reference's generator renders it."""
  text = _TEMPLATE[family].replace(
      "__EXAMPLE__", examples_lib.BY_FAMILY[family].rstrip("\n") + "\n"
  )
  if family in TOOL_FAMILIES:
    category, description, ideas = TOOL_USE_SKILLS[skill]
  else:
    description, ideas = COGNITIVE_SKILLS[skill]
    category = ""
  ideas = list(ideas)
  if family == "single_turn_game":
    if len(ideas) > 4:
      ideas = rng.sample(ideas, 4)
    text = text.replace("__EXAMPLES__", "  " + ", ".join(ideas))
  elif family == "multi_turn_game":
    ideas = list(MULTITURN_SKILL_EXAMPLES.get(skill, ideas))
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
        TOOL_USE_DIFFICULTY.get(difficulty, TOOL_USE_DIFFICULTY["hard"]),
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
    domain = rng.choice(TOOL_USE_DOMAINS)
    task_type = rng.choice(TASK_TYPE_ROTATION)
    text = text.replace("__SKILL_CATEGORY__", category)
    text = text.replace(
        "__DOMAIN_BLOCK__", _DOMAIN_BLOCK.replace("__DOMAIN__", domain)
    )
    text = text.replace("__TASK_TYPE_BLOCK__", TASK_TYPE_BLOCKS[task_type])
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
  family = DEFAULT_FAMILY if family is None else family
  _check_family(family)
  if family in GAME_FAMILIES and getattr(document, "text", None):
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

  Returns:
    [{"role": "system", ...}, {"role": "user", ...}]
  """
  family = effective_family(family, document)
  text = getattr(document, "text", None) if document is not None else None
  if skill is None:
    skill = (
        REFERENCE_TOOL_USE_SKILLS[0]
        if family in TOOL_FAMILIES
        else REFERENCE_SKILLS[0]
    )
  if skill not in skills_for(family):
    raise ValueError(
        f"skill {skill!r} is not a skill of the {family!r} family; one of"
        f" {skills_for(family)}"
    )
  difficulty = DEFAULT_DIFFICULTY if difficulty is None else difficulty
  if difficulty not in DIFFICULTIES:
    raise ValueError(f"difficulty {difficulty!r} is not one of {DIFFICULTIES}")
  content = _family_prompt(
      family, skill, difficulty, random.Random(seed), text, max_turns
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
          "content": TOOL_USE_HINT_SYSTEM if tool_use else HINT_SYSTEM,
      },
      {"role": "user", "content": f"Environment code:\n```python\n{code}\n```"},
  ]
