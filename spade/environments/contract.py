"""The environment contract: what an environment program is and must do.

An environment program is one Python source file in the reference
implementation's format (``spade-rl/spade``, ``spade/core/envs/``), so its
generated pools, games and tool use alike, load unchanged. What is accepted
is what the reference's loader and ``validate_game`` accept
(``synthetic_game_env.py``, ``utils/game_files.py``), minus hostile code:

* the environment class is the first name defined that ends in ``Env`` and
  is callable (``ToolUseBaseEnv`` and ``Env`` excepted); a leading one
  without ``reset`` and ``step`` (a helper, an empty base) is passed over.
  Other classes may end in ``Env``.
* it is created with no arguments, so it plays with the turns its designer
  chose; when that raises TypeError (``__init__(self, max_turns)`` without a
  default) it is created with ``max_turns=`` the turn budget, as upstream.
* ``reset(self, seed=None)`` returns ``(observation: str, info: dict)`` or a
  bare observation str (info ``{}``); the observation is not empty.
* ``step(self, action: str) -> (observation: str, reward: float,
  terminated: bool, truncated: bool, info: dict)`` with a finite reward in
  [-10, 10], for the replies the reference's checks send
  (``REFERENCE_ACTIONS``). During play an exception in ``step()`` is the
  reference's outcome: reward -1, episode over.
* ``close(self)``, when defined, does not raise.
* optional ``hint(self) -> str`` (a privileged hint for the episode) and
  ``solution(self)``: a list of replies that wins (replayed, see below) or a
  readable account (kept as privileged text for hints).
* tool use: the reference's protocol. ``ToolUseBaseEnv`` is pre-bound (no
  import needed): tools are ``tool_<name>`` methods described in
  ``self._tools``; ``get_tools()`` returns OpenAI-style schemas; a reply may
  hold several ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  blocks, each run with ``execute_tool(name, arguments) -> {"output": str,
  "returncode": int}`` without spending one of the environment's turns; a
  reply with ``<answer>...</answer>`` or without a parsable call goes to
  ``step()`` (``tool_calls.reply_actions``).

Every call (``reset``, ``step``, ``hint``, ``solution``, ``execute_tool``,
``close``) must finish within ``sandbox.call_timeout_s`` (``CALL_TIMEOUT_S``)
of CPU time (and four times that of wall time, for a call that sleeps) and
return at most ``MAX_OUTPUT_CHARS`` characters; programs may use the
standard library plus ``numpy`` and ``math_verify``, and the runtime
pre-binds common names (``random``, ``re``, ``math``, ``json``, ``deque``,
typing names, ...) as upstream.

Stricter qualities are recorded, not required, as the verdict's
``properties`` (``PROPERTIES``); ``environments.require`` in the config turns
a missing one into an invalid verdict with reason ``requires_<property>``.
Validation (``spade.environments.validator.validate_program``) returns a
JSON-able verdict whose ``reason`` is one of ``REASONS``.
"""

# Rewards a step may return (the reference's range), and the reward of a win.
REWARD_MIN = -10.0
REWARD_MAX = 10.0
WIN_REWARD = 1.0
# The reference's tool-use base class pays this for an unparsable reply.
FORMAT_ERROR_REWARD = -0.1
# The reward of a step that raised during play (the reference's wrapper).
STEP_ERROR_REWARD = -1.0

# The turn budget given to a class whose __init__ needs max_turns (the
# reference gives its config's max_turns; ToolUseBaseEnv's default is 10).
FALLBACK_MAX_TURNS = 10

# The replies the reference's validate_game sends; a failure on one of these
# refuses the program. Other smoke replies only record `robust`.
REFERENCE_ACTIONS = ("\\boxed{1}", "\\boxed{test}", "\\boxed{42}")

# Default per-call budget (CPU seconds) of reset/step/... at validation, and
# the most characters one call may return (observation plus info).
CALL_TIMEOUT_S = 0.5
MAX_OUTPUT_CHARS = 65_536
# The observation space of the gymnasium adapter.
MAX_OBS_CHARS = MAX_OUTPUT_CHARS

# The seeds the reset gate (`environments.reset_gate`) resets with: the
# reference's criteria_throw_at_reset(seeds=(0, 1, 2)).
RESET_GATE_SEEDS = (0, 1, 2)

# Default number of smoke steps validation plays before the solution replay.
SMOKE_STEPS = 8

# Default in-process time budget of a whole validation; the sandbox host
# enforces its own hard deadline on top of it.
VALIDATE_BUDGET_S = 20.0

# Recorded qualities of a valid program (the verdict's "properties").
PROPERTIES = (
    "deterministic",  # same seed, same episode: two instances and a re-reset
    "seeded",  # deterministic, and another seed gives another episode
    "robust",  # step() handled every smoke reply (no raise, right types)
    "rewards_in_unit",  # every reward seen was within [-1, 1]
    "has_hint",  # hint() returned a str, the same for the same seed
    "solution_replayed",  # solution() replayed (tool calls too) to a win
)

# Reason codes of a verdict, in the order validation checks them.
REASONS = (
    "ok",
    "syntax",  # the source does not parse
    "static",  # the AST pass saw a file/process/network/introspection escape
    "load",  # module-level code raised
    "no_env_class",  # no callable whose name ends in "Env"
    "init",  # creating the environment raised
    "reset",  # reset() raised or did not return (str, dict) or a str
    "step",  # step() raised or returned the wrong types on a reference reply
    "reward_range",  # a reward not finite or outside [REWARD_MIN, REWARD_MAX]
    "close",  # close() raised
    # environments.reset_gate: a success criterion raised on the reset state
    # at every tested seed (the reference's criteria_throw_at_reset)
    "criteria_throw_at_reset",
    "call_timeout",  # one call ran longer than the per-call budget
    "output_too_large",  # one call returned more than the output cap
    "timeout",  # the whole validation ran out of time
    "crash",  # the program ended the process (exit) or the worker died
) + tuple(f"requires_{p}" for p in PROPERTIES)

# Categories of the seed library (and of designer prompts).
CATEGORIES = (
    "pattern",
    "deduction",
    "arithmetic",
    "spatial",
    "planning",
    "causal",
    "memory",
    "optimisation",
    "language",
    "tool_use",
)
