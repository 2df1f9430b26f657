"""The environment contract: what an environment program is and must do.

An environment program is one Python source file that defines a class whose
name ends in ``Env``. It is the reference implementation's format
(``spade-rl/spade``, ``spade/core/envs/``), so its generated pools, games and
tool use alike, load unchanged:

* ``__init__(self, max_turns=..., **kwargs)``; the class is instantiated with
  no arguments, so it plays with the number of turns its designer chose.
* ``reset(self, seed=None) -> (observation: str, info: dict)``.
* ``step(self, action: str) -> (observation: str, reward: float,
  terminated: bool, truncated: bool, info: dict)``.
* optional ``close(self)``.
* optional ``hint(self) -> str``: a privileged hint for the current episode.
* optional ``solution(self)``: a list of actions that wins the current
  episode; validation replays it and requires ``terminated=True`` with a final
  reward of 1.0. A string instead (the reference's tool-use form, a readable
  account of the winning calls) is not replayable and is kept as privileged
  information for the hint writer.
* a class docstring: one paragraph saying what the environment is.
* tool use: the reference's protocol. The class may subclass
  ``ToolUseBaseEnv`` (pre-bound by the runtime, no import needed): tools are
  ``tool_<name>`` methods described in ``self._tools``; ``get_tools()``
  returns OpenAI-style function schemas; the agent calls
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` and submits
  ``<answer>...</answer>``; the base class parses, dispatches and checks
  ``self._expected_answer`` with a tolerant numeric match, paying -0.1 for a
  format error.

Programs may use the standard library plus ``numpy`` and ``math_verify``; the
runtime pre-binds common names (``random``, ``re``, ``math``, ``json``,
``deque``, typing names, ...) so code that forgot an import still loads.
Step rewards are finite and within [-1, 1]; a win returns 1.0 with
``terminated=True``. An episode's return is its total reward clipped to
[0, 1]. The agent's whole reply is the action; games put the move inside
``\\boxed{...}``. The same seed gives the same episode.

Validation (``spade.environments.validator.validate_program``) returns a
JSON-able verdict whose ``reason`` is one of ``REASONS``.
"""

# Rewards a step may return, and the reward of a win.
REWARD_MIN = -1.0
REWARD_MAX = 1.0
WIN_REWARD = 1.0
# The reference's tool-use base class pays this for an unparsable reply.
FORMAT_ERROR_REWARD = -0.1

# Observations (and hints) longer than this are refused: they would not fit
# an agent's context and usually mean a bug (a board printed in a loop).
MAX_OBS_CHARS = 20_000

# Default number of smoke steps validation plays before the solution replay.
SMOKE_STEPS = 5

# Default in-process time budget of a whole validation; the sandbox host
# enforces its own hard deadline on top of it.
VALIDATE_BUDGET_S = 20.0

# Reason codes of a verdict, in the order validation checks them.
REASONS = (
    "ok",
    "syntax",  # the source does not parse
    "static",  # the AST pass saw a file/process/network/introspection escape
    "load",  # module-level code raised
    "no_env_class",  # no class whose name ends in "Env"
    "many_env_classes",  # several unrelated "*Env" classes: which one?
    "init",  # instantiating the class raised
    "reset",  # reset() raised or did not return (str, dict)
    "obs_size",  # an observation or hint longer than MAX_OBS_CHARS
    "determinism",  # the same seed gave different first observations
    "step",  # step() raised or returned the wrong types
    "reward_range",  # a reward not finite or outside [REWARD_MIN, REWARD_MAX]
    "hint",  # hint() raised or did not return a str
    "solution",  # solution() raised, or its replay did not win
    "timeout",  # the time budget ran out
    "crash",  # the program ended the process (exit) or the worker died
)

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
