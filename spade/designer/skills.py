"""The data the designer prompts are conditioned on: families and skills.

The reference implementation's tables (`spade-rl/spade`): the prompt
families and difficulties, the games recipe's six skills and the tool-use
recipe's two, the cognitive skills with their concept ideas
(`spade/core/game_generator.py`), the multi-turn game ideas
(`spade/core/prompts/template.py`), and the tool-use skills, difficulty
texts, domains and task variants (`spade/core/prompts/tool_use_template.py`).
`spade.designer.design_prompts` chooses among them and renders the messages.
"""

from __future__ import annotations

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
DOMAIN_BLOCK = (
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


def skills_for(family: str) -> tuple[str, ...]:
  """The skills a family can be conditioned on."""
  check_family(family)
  if family in TOOL_FAMILIES:
    return tuple(TOOL_USE_SKILLS)
  return tuple(COGNITIVE_SKILLS)


def check_family(family: str) -> None:
  """Raises ValueError unless `family` is one of `FAMILIES`."""
  if family not in FAMILIES:
    raise ValueError(f"unknown prompt family {family!r}; one of {FAMILIES}")
