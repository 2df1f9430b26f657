"""The reference's model-based solvability audit (`core/env_validator.py`).

Its tool-use recipe (`--spade-use-env-validator`, `env_validator_model=
"self"`) asks the training model, after `validate_game` and the reset gate,
whether each new program can be won: a system prompt and a template chosen
by the game type (tool use: trace every success criterion to a tool that
produces its state, reject the impossible, keep the hard; otherwise: a
lenient playable/winnable check), answered with `\\boxed{yes}` or
`\\boxed{no}` at temperature 0.3 within 16,384 tokens. A "no" refuses the
program (the design is sampled again); no box, an empty reply or a failed
call keeps it. The reply trains nothing.

This module holds the reference's prompts (character for character), how a
reply is read, and `audit`, which runs them through any `generate` callable
(our engine's designer role would answer it; a scripted model does in the
tests). It runs no program code, so the trainer may call it. The loop does
not call it yet: docs/reference_recipe.md, item 11.
"""

from __future__ import annotations

import re
from typing import Callable, Sequence

# The reference's sampling of the audit (`core/types.py`:
# env_validator_temperature, env_validator_max_tokens).
TEMPERATURE = 0.3
MAX_NEW_TOKENS = 16384
# The reason of a refused verdict: the reference's reject_stage.
REASON = "env_validator"

# The reference's prompts (ENV_VALIDATION_* and TOOL_USE_ENV_VALIDATION_*),
# format templates with one field, {game_code}.
SYSTEM = (
    "You review auto-generated Python game environments. Only reject games "
    "with clear, fatal bugs. When in doubt, accept."
)

TEMPLATE = (
    "Is this game environment playable? Only reject if there is a clear fatal "
    "bug.\n"
    "\n"
    "```python\n"
    "{game_code}\n"
    "```\n"
    "\n"
    "Check these two things:\n"
    "\n"
    "1. **Solvable**: Can a player who understands the puzzle submit a correct "
    "answer? (Reject only if the solution is impossible to derive — e.g., "
    "answer depends on hidden randomness, or the puzzle description doesn't "
    "match the checking logic.)\n"
    "\n"
    "2. **Winnable**: Does submitting the correct answer actually give a "
    "positive reward and end the game? (Reject only if there's an obvious bug "
    "— e.g., type mismatch in comparison that always fails, or success path is "
    "unreachable.)\n"
    "\n"
    "Minor issues like imperfect error messages, unusual formatting, or edge "
    "cases are fine — do NOT reject for those.\n"
    "\n"
    "Answer \\boxed{{yes}} unless there is a clear fatal bug, then "
    "\\boxed{{no}}."
)

TOOL_USE_SYSTEM = (
    "You rigorously audit auto-generated Python tool-use game environments for "
    "SOLVABILITY. Your one job: REJECT games that are IMPOSSIBLE to solve (no "
    "tool-call path can satisfy the success criteria), while KEEPING games "
    "that are merely HARD (a path exists but the agent must discover hidden "
    "values by calling tools). Difficulty is GOOD curriculum; impossibility is "
    "fatal. Trace every success criterion to the tool that produces it — if "
    "any required state is unreachable, reject."
)

TOOL_USE_TEMPLATE = (
    "Audit this multi-turn tool-use game for SOLVABILITY. The agent calls "
    "tools turn-by-turn and submits <answer>done</answer> after satisfying "
    "every step. The game is SOLVABLE iff there EXISTS a sequence of tool "
    "calls that makes every success/termination criterion True.\n"
    "\n"
    "```python\n"
    "{game_code}\n"
    "```\n"
    "\n"
    "Trace it, criterion by criterion:\n"
    "\n"
    "1. **List the success criteria** — the per-step checks (e.g. the lambdas "
    "in self._message_criteria, the _advance_if_done / _check_answer / reward "
    "/ termination logic). Note the EXACT state each one requires (e.g. "
    "`state['order_status'] == 'completed'`, `state['last_action'] == "
    "'generated_invoice'`).\n"
    "\n"
    "2. **For EACH required state value, find the tool that PRODUCES it.** "
    "Scan every tool method for an assignment setting that state to the "
    "required value (e.g. `self._state['order_status'] = 'completed'`).\n"
    "   - If EVERY criterion's required state IS set by some tool → SOLVABLE "
    "(keep it, even if very hard).\n"
    "   - If ANY criterion requires a state value that NO tool ever assigns "
    "(unreachable), OR two criteria are mutually contradictory → the success "
    "path is IMPOSSIBLE → REJECT.\n"
    "   - NOTE on randomness (read carefully — this is the most common "
    "FALSE-reject): a random value is FINE and DISCOVERABLE as long as some "
    "tool RETURNS it to the agent. Generated games routinely create random IDs "
    "/ codes / dates either at reset() OR inside a tool (e.g. `flight_id = "
    "f'FL{{random.randint(1000,9999)}}'` is generated inside "
    "tool_search_flights and ECHOED in its result, then the success criterion "
    "checks a state flag the agent set using that discovered id). The agent "
    "reads the value from the tool result and uses it on the next call → "
    "SOLVABLE, do NOT reject. Only reject for randomness if (a) a required "
    "value is NEVER surfaced in ANY tool result and cannot be queried — the "
    "agent has literally no way to ever observe it; or (b) a tool returns a "
    "DIFFERENT random value on every call for the SAME input, so the agent can "
    "never act on a stable value. Random-at-reset that is later returned by a "
    "query tool is always fine.\n"
    "\n"
    "   GROUNDED example to REJECT: a criterion checks `state['order_status'] "
    "== 'completed'`, but no tool anywhere assigns `order_status = "
    "'completed'` (tools only set it to 'viewing'/'shipped'). The agent can "
    "NEVER satisfy it → impossible → reject.\n"
    "\n"
    "2b. **Also catch these IMPOSSIBLE / unwinnable criteria (common bugs that "
    "look fine at a glance):**\n"
    "   - TYPE-MISMATCH: a criterion whose Python can never be True because it "
    "reads state with the wrong shape — e.g. `'laptop' in s['order_history']` "
    "when order_history is a list of DICTS (membership of a string in a list "
    "of dicts is ALWAYS False), or `s['x'] == 5` when the tool stores `s['x']` "
    "as a string '5'. Trace the actual type the tool writes vs the type the "
    "criterion compares. If they can never be equal → impossible → REJECT.\n"
    '   - UNREACHABLE TOOL FIELD: a criterion\'s required state is "set" only '
    "by a tool that itself can never succeed — e.g. tool_process_refund looks "
    "up a refund by `r['refund_id']`, but the tool that creates refunds never "
    "stores a 'refund_id' key, so process_refund always errors and the "
    "criterion's state is never written → impossible → REJECT.\n"
    "   - UNDERIVABLE VALUE: a criterion requires a SPECIFIC hidden value (an "
    "exact date / id / amount / threshold) that NEITHER the user instruction "
    "states NOR any tool result reveals — so the agent can only GUESS. E.g. "
    'instruction "schedule a visit next week" but criterion '
    "`s['last_updated'] >= '2024-01-22'`; or criterion needs order id '1024' "
    "that no instruction names and no tool returns. The agent cannot reliably "
    "reach it → treat as unwinnable → REJECT. (Contrast with the randomness "
    "note above: a value a tool ECHOES back IS derivable — keep it.)\n"
    "   - PRE-SATISFIED STEP: a criterion that is already True on the state "
    "reset() builds (e.g. `s['inventory']['monitor'] >= 5` when reset stocks "
    "8, or a verify-step criterion `s['line_status'] == 'active'` when it "
    "starts 'active'). That step auto-completes on the agent's FIRST tool call "
    "without doing its instruction. Trace each criterion against the reset() "
    "state. REJECT only if the MAJORITY of steps are pre-satisfied (the game "
    "degenerates — the agent wins without doing the task); a single "
    "pre-satisfied step in an otherwise sound game is a KEEP.\n"
    "\n"
    "3. **Do NOT reject for difficulty.** KEEP these: hidden values the agent "
    "must discover by calling lookup/list tools (e.g. a specific id `T104` "
    "that a search tool returns), long strict multi-step sequences, "
    "distractor/out-of-scope tools, needing to read each user instruction "
    "carefully. As long as a tool-call path to every criterion exists AND "
    "every required value is stated-or-discoverable, it is GOOD hard "
    "curriculum — keep it.\n"
    "\n"
    "4. Ignore cosmetic issues (error-message wording, formatting, harmless "
    "edge cases).\n"
    "\n"
    "Reject ONLY when a required success state is genuinely unreachable / "
    "contradictory / type-impossible / set by a tool that can never succeed / "
    "dependent on an underivable hidden value. Otherwise accept (difficulty is "
    "GOOD).\n"
    "\n"
    "Answer \\boxed{{no}} if any success criterion is impossible or unwinnable "
    "by the above tests; else \\boxed{{yes}}."
)


def audit_messages(code: str, *, tool_use: bool) -> list[dict[str, str]]:
  """The chat the reference sends for one program (`validate_async`).

  Args:
    code: the program's source, whole (the reference cuts nothing).
    tool_use: the tool-use auditor (the reference's game_type "tool_use");
      False: the lenient playable/winnable check (any other game type).

  Returns:
    [{"role": "system", ...}, {"role": "user", ...}]
  """
  system, template = (
      (TOOL_USE_SYSTEM, TOOL_USE_TEMPLATE) if tool_use else (SYSTEM, TEMPLATE)
  )
  return [
      {"role": "system", "content": system},
      {"role": "user", "content": template.format(game_code=code)},
  ]


_BOXED = re.compile(r"\\boxed\{(.+?)\}")


def keeps(reply: str | None) -> bool:
  """Whether the reference keeps a program on this audit reply.

  The first `\\boxed{...}` decides: "yes", "y" or "true" (any case, outer
  spaces ignored) keeps it, anything else refuses it; a reply without a
  box, an empty one or None (the call failed) keeps it.
  """
  if not reply:
    return True
  match = _BOXED.search(reply)
  if match is None:
    return True
  return match.group(1).strip().lower() in ("yes", "y", "true")


def audit(
    codes: Sequence[str],
    generate: Callable[[list[list[dict[str, str]]]], Sequence[str | None]],
    *,
    tool_use: bool,
) -> list[tuple[bool, str]]:
  """Audits programs with one batched call of `generate`.

  Args:
    codes: the programs' sources (valid ones: the reference audits only
      what passed `validate_game` and the reset gate).
    generate: maps a list of chats (`audit_messages`) to one reply each,
      None for a chat it could not answer (e.g. a prompt over the model's
      budget), which keeps its program, as the reference's error path does.
    tool_use: which of the reference's prompts (`audit_messages`).

  Returns:
    (keep, reply) per program, in order.
  """
  if not codes:
    return []
  replies = list(
      generate([audit_messages(code, tool_use=tool_use) for code in codes])
  )
  if len(replies) != len(codes):
    raise ValueError(
        f"generate returned {len(replies)} replies for {len(codes)} chats;"
        " it must answer each chat (None for one it cannot)"
    )
  return [(keeps(r), r or "") for r in replies]


def refusal_message(reply: str) -> str:
  """A verdict's message for a refused program: the reply's start, on one
  line, as the reference's RuntimeError shows it (200 characters)."""
  return "the solvability audit judged it unwinnable: " + reply[:200].replace(
      "\n", " "
  )
