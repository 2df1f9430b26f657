"""The reference implementation's designer prompt texts, one a family.

Ported from `spade-rl/spade` `spade/core/prompts/template.py`
(`generate_game_generation_prompt`, `generate_multiturn_game_generation_prompt`),
`corpus_template.py` (`generate_corpus_grounded_prompt`) and
`tool_use_template.py` (`generate_tool_use_prompt`, `_V_MULTITURN_PROMPT`),
rendered once and kept verbatim with `__NAME__` placeholders that
`spade.designer.design_prompts` fills in, with the system prompts of its chat
templates and the hint pass's (`hint_generator.py`). Three changes, each
marked by its placeholder: the single-turn and corpus-grounded prompts show
only the reference's interface skeleton by default, and a complete example
program (`__EXAMPLE_BLOCK__`, from `spade.designer.examples`) with
`designer.prompt_example="complete"`; the multi-turn and tool-use prompts
always show their complete example (`__EXAMPLE__`), as the reference's do;
the two game families state their difficulty (`DIFFICULTY: __DIFFICULTY__`;
the reference passes it to them and leaves it unused); the multi-turn game's
turn budget comes from the caller (`__MAX_TURNS__`).
"""

# pylint: disable=line-too-long

SINGLE_TURN_GAME = r'''Create a challenging single-player text-based game as a Python class that tests: __SKILL_NAME__ (__SKILL_DESCRIPTION__).

GAME CONCEPT IDEAS (pick one or invent your own):
__EXAMPLES__

RULES:
- Be creative with the game concept — it can be a puzzle, riddle, logic problem, code tracing, word game, optimization task, or any reasoning challenge.
- One task per episode. Player answers with \boxed{answer}.
- Give your class a descriptive, unique name.
- The task must be DETERMINISTICALLY SOLVABLE from the observation alone — all information needed to derive the answer must be explicitly stated. No hidden state the player cannot see.
- The observation should be clearly written so a careful reader can follow the logic to the answer.

INFORMATION HIDING (critical for RL training):
- The observation must NOT contain the answer. The player must DERIVE it.
- For sequence/pattern games: show only partial data, never the target value.
- Never state the pattern rule directly — the player must discover it.
- Wrong-answer feedback must give hints (e.g., higher/lower, which part is wrong), never reveal the full solution.
- The player must use \boxed{answer} format — remind them in the observation.

DIFFICULTY: __DIFFICULTY__
- The task MUST require at least 3 distinct reasoning steps — not solvable in one or two arithmetic operations.
- Random guessing should succeed < 1% of the time — use large answer spaces.
- Use randomized parameters large enough that the answer is not obvious.
- Do NOT generate simple formula-substitution or single-operation problems.
- Compute the solution from the generated puzzle; never hardcode it.
  WRONG: return 'recursive'  # same answer regardless of puzzle
  WRONG: return str(random.randint(1,10))  # not derived from the actual task
  RIGHT: generate puzzle first, then compute self._solution from it

INTERFACE CONTRACT:
```python
import random
import re
from typing import Any, Optional, Tuple, Dict, List
from math_verify import parse, verify

def verify_answer(player_answer, solution):
    """Check if answer is correct: string match first, then math equivalence."""
    if str(player_answer).strip() == str(solution).strip():
        return True
    try:
        return verify(parse(player_answer), parse(solution))
    except:
        return False

class DescriptiveNameEnv:
    def __init__(self, max_turns=10, **kwargs):
        ...
        self.reset()

    def reset(self, seed=None) -> Tuple[str, dict]:
        # Generate a new task. Returns (observation_with_instructions, {})
        ...

    def solution(self) -> str:
        # REQUIRED: Return the exact answer string that solves the current task.
        ...

    def step(self, action: str) -> Tuple[str, float, bool, bool, dict]:
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r'\\boxed\{([^}]+)\}', action)
        if match and verify_answer(match.group(1), self.solution()):
            return ("Correct! ...", 1.0, True, False, {})
        elif truncated:
            return (f"Time's up. The answer was {self.solution()}. [task]", 0.0, False, True, {})
        else:
            return ("Wrong. [specific hint about why]. Try again. [task description]", 0.0, False, False, {})
        # EVERY code path must return (str, float, bool, bool, dict) — no exceptions.

    def close(self): pass
```

EPISODE STRUCTURE (critical for RL training):
1. reset(): Generate ONE task/puzzle for this episode
2. step(): Player tries to solve that SAME task multiple times
3. Correct answer → terminated=True (episode ends with success)
4. Max turns reached → truncated=True, reveal the solution so the model learns from failure
5. NEVER generate a new task inside step() — the task is fixed for the whole episode

OBSERVATION REQUIREMENTS:
- Turn 1 (reset): Show instructions + task + remind player to use \boxed{answer} format
- Turn 2+ (step): Show specific feedback on the attempt + the SAME task (no instructions)
- The task/puzzle MUST be visible every turn or the model won't know what to solve
- Feedback must be specific to the attempted answer, not generic ('Wrong. Try again.' is not enough)
- No \boxed{} in action: remind the player of the format + show task (do not terminate)

ROBUSTNESS:
- Never divide by a value that could be zero — regenerate if needed
- Initialize ALL instance variables in __init__ before calling reset()
- Return empty dict {} for info (never strings)
- Every code path in step() must return a 5-tuple (str, float, bool, bool, dict).
- Naming: never store data in self.solution — that shadows the required solution() method. Use self._solution or self._answer instead.
- Brace escaping: in f-strings, {word} evaluates word as a Python expression. To write a literal \boxed{answer} escape it as \boxed{{answer}}. Same rule with .format(): any literal brace must be doubled.

__EXAMPLE_BLOCK__Generate the complete Python code in a ```python block.'''

MULTI_TURN_GAME = r'''Create an interactive multi-turn text-based game as a Python class that tests: __SKILL_NAME__ (__SKILL_DESCRIPTION__).

GAME CONCEPT IDEAS for __SKILL_NAME__ (pick one or invent similar):
__EXAMPLES__

DIFFICULTY: __DIFFICULTY__

WHAT MAKES A GOOD MULTI-TURN GAME:
Think of classic text adventures, board games, or strategy games. The player
navigates a world that changes with every action. Good examples:
  - Grid exploration: move through rooms, find keys to unlock doors, reach the exit
  - Trading: buy low / sell high across rounds with fluctuating prices
  - Survival: manage health, food, tools while exploring — wrong choices kill you
  - Investigation: question suspects, search locations, piece together clues
  - Tower defense: place defenses, then waves arrive — adapt strategy each wave
  - Crafting: gather materials, combine them in the right order to build something

WHAT TO AVOID (common failure modes):
  BAD: A math puzzle where the player guesses the answer and retries on failure.
       That is a single-turn puzzle with retry, NOT a multi-turn game.
  BAD: Increment/decrement a variable until it matches a target.
       That is a linear search, not a game — there are no decisions.
  BAD: The player has only one reasonable action each turn (e.g., always 'allocate').
       If the optimal path is obvious, there is no strategic depth.
  BAD: The game can be solved in 1-3 turns. Too short for multi-turn training.
  BAD: Embedding single-turn math/logic puzzles inside a multi-turn frame.
       E.g., 'go to forest, solve 2+3, collect wood' — the actual decisions are trivial.
  BAD: Using input() to get player answers. NEVER use input(). The action parameter
       to step() IS the player's full response. Parse everything from it.

DESIGN REQUIREMENTS:
- The game world has STATE that changes on every action (positions, inventories,
  health, money, unlocked areas, NPC attitudes, etc.).
- Each turn, the player chooses from 2+ meaningfully different actions.
- Some actions are BETTER than others — wrong choices waste turns or cause harm.
- The game will be played for at most __MAX_TURNS__ turns. Design difficulty,
  resource budgets, and pacing accordingly. Optimal play should win in
  roughly __OPT_LO__–__OPT_HI__ turns.
- Random play should lose most of the time.
- The game must have a clear WIN condition and ideally a LOSE condition too.

ACTION FORMAT:
- The player wraps every action in \boxed{action}. The step() method extracts
  the content inside \boxed{} and interprets it.
- Show available actions clearly in every observation, e.g.:
    Actions: \boxed{go north}, \boxed{go south}, \boxed{pick up key}, \boxed{rest}
- If the player's input has no \boxed{}, return a format reminder. Do NOT terminate.

OBSERVATION FORMAT:
- Each observation must show: (1) current state, (2) result of last action,
  (3) available actions, (4) progress (e.g., 'Turn 3/12 | HP: 7/10 | Items: [key]').
- The initial observation (from reset) includes rules, goal, and starting state.

REWARD:
- Win: reward = 1.0, terminated = True
- Lose: reward = 0.0, terminated = True
- Intermediate turns: reward = 0.0
- Max turns without winning: reward = 0.0, truncated = True

INTERFACE:
```python
import random
import re
from typing import Tuple
from math_verify import parse, verify

def verify_answer(player_answer, solution):
    """Check if answer is correct: string match first, then math equivalence."""
    if str(player_answer).strip() == str(solution).strip():
        return True
    try:
        return verify(parse(player_answer), parse(solution))
    except:
        return False

class DescriptiveNameEnv:
    def __init__(self, max_turns=__MAX_TURNS__, **kwargs):
        self.max_turns = max_turns
        self.turn_count = 0
        # ALL state variables initialized here
        self.reset()

    def reset(self, seed=None) -> Tuple[str, dict]:
        if seed is not None:
            random.seed(seed)
        self.turn_count = 0
        # Randomize the game world
        return observation, {}

    def step(self, action: str) -> Tuple[str, float, bool, bool, dict]:
        self.turn_count += 1
        match = re.search(r'\\boxed\{([^}]*)\}', action)
        if not match:
            return ('Use \\boxed{action} format.', 0.0, False, False, {})
        cmd = match.group(1).strip().lower()
        # Update state, check win/lose
        # Use verify_answer(cmd, solution) for numeric comparisons
        truncated = self.turn_count >= self.max_turns
        return (observation, reward, terminated, truncated, {})

    def close(self): pass
```

REFERENCE EXAMPLE — Trading Game (shows the pattern; yours must be DIFFERENT):
```python
__EXAMPLE__```

ROBUSTNESS:
- NEVER use input(). The step(action) parameter IS the player's response.
- Never divide by a value that could be zero.
- Initialize ALL instance variables in __init__ before calling reset().
- Return empty dict {} for info (never strings).
- Every code path in step() must return a 5-tuple (str, float, bool, bool, dict).
- Handle unexpected player input gracefully (show valid actions, don't crash).
- Use only the Python standard library (random, re, collections, etc.).
- Brace escaping: in f-strings, literal braces must be doubled {{ }}.
- NEVER put backslashes inside f-string expressions. Use a variable instead:
    BAD:  f'{"\n".join(items)}'
    GOOD: sep = '\n'; f'{sep.join(items)}'  OR  '\n'.join(items)

Generate the complete Python code in a ```python block.
Remember: the game must have BRANCHING DECISIONS where different choices
lead to different outcomes. A game with only one reasonable action per turn is not acceptable.'''

CORPUS_GAME = r"""You are given a reference document. Create an INTERACTIVE, MULTI-TURN Python game
environment grounded in a concept/technique from this document.

<REFERENCE_DOCUMENT>
__DOCUMENT__
</REFERENCE_DOCUMENT>

This MUST be a genuine multi-turn INTERACTIVE environment, NOT a one-shot question-and-answer quiz.

HOW THE AGENT ACTS (this matches the training pipeline — follow it exactly):
- Every turn the agent submits ONE action wrapped as \boxed{<action>}, e.g. \boxed{measure node 3},
  \boxed{move north}, \boxed{open valve A}. step() receives that string; extract the action with
  re.search(r'\\boxed\{(.+?)\}', action) and treat the extracted text as an interactive COMMAND.
- The extracted text is a COMMAND / move / query that CHANGES the environment — it is NOT a final
  answer to grade once. step() must UPDATE the environment's state from it and return a NEW
  observation reflecting the changed state.

WHAT MAKES IT MULTI-TURN (required):
- The goal CANNOT be reached in one action. It needs a SEQUENCE of actions — explore to uncover
  hidden information, then act on it; or manipulate state step-by-step toward a target.
- HIDDEN STATE: the agent does NOT see everything at reset(); it must act to reveal/probe state
  across turns (the observation grows/changes as it acts).
- PARTIAL reward for progress toward the goal; terminated=True only when the goal is reached.
- Each turn's observation must (a) reflect the updated state and (b) remind the agent to reply
  with its next action as \boxed{<action>}.

DO NOT (these collapse it back to single-shot QA):
- Do NOT extract \boxed{answer}, grade it once, and terminate. \boxed carries a per-turn COMMAND,
  not a final answer.
- Do NOT state the full problem at reset() and just check one submitted value.
- Do NOT repeat the SAME static task every turn with only 'wrong, try again' feedback.

GROUNDING: the interaction must require understanding a concept/technique from the document
(e.g. if it describes an algorithm, the agent EXECUTES it step-by-step interactively; if it
describes a system, the agent OPERATES it over turns). Never reference the document in the game
text (no 'according to the passage'); write it as a standalone environment.

INTERFACE CONTRACT (interactive; \boxed wraps each turn's COMMAND):
```python
import random, re
from typing import Tuple, Dict

class DescriptiveInteractiveEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.reset()
    def reset(self, seed=None) -> Tuple[str, dict]:
        self.turn_count = 0
        # set up HIDDEN state + a goal needing several actions; randomize by seed.
        # return (observation: situation + AVAILABLE ACTIONS + 'reply with \boxed{<action>}',
        #         but NOT the full solution), {}
        ...
    def step(self, action: str) -> Tuple[str, float, bool, bool, dict]:
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        m = re.search(r'\\boxed\{(.+?)\}', action)
        cmd = (m.group(1) if m else action).strip()      # the per-turn COMMAND
        # 1) PARSE cmd into an operation; 2) UPDATE self state; 3) build a NEW observation
        #    reflecting the updated state; 4) reward = partial progress in [0,1],
        #    terminated=True only when the goal is reached.
        # every code path returns (str, float, bool, bool, dict)
        ...
    def solution(self) -> str:
        # a reference action-sequence (or goal description) that solves it
        ...
    def close(self): pass
```

REWARD SCALE: keep total reward in [0, 1]; partial progress < 1.0, full success = 1.0.

ROBUSTNESS (the most common failures — follow ALL of these or the env won't load):
- BRACE ESCAPING: in f-strings and .format(), {word} evaluates word; to write a LITERAL brace you
  must DOUBLE it. To print \boxed{<action>} inside an f-string, write \boxed{{<action>}}.
- Initialize ALL instance variables in __init__ BEFORE calling reset() (no AttributeError mid-episode).
- Imports: use ONLY the Python standard library plus `math` and `random`. Import everything you use;
  never call an unimported name (no bare `integrate`, no `np.`, no `x.cos()` — use `math.cos(x)`).
- Every step() code path returns the 5-tuple (str, float, bool, bool, dict); info is always a dict {}.
- Never crash on an unrecognized/garbage command — return a helpful observation + reward 0.0 instead.
- Never divide by a value that could be zero; never store data in self.solution (use self._solution).

SELF-VERIFICATION before finalizing:
- Trace TWO different action sequences from reset(seed=0): does the observation CHANGE based on the
  actions? (If it never changes, it is NOT interactive — fix it.)
- Does \boxed carry a per-turn COMMAND that evolves state, rather than a final answer that ends it?
- Is partial reward given for progress, kept in [0,1]?

__EXAMPLE_BLOCK__Target skill: __SKILL_NAME__ (__SKILL_DESCRIPTION__). DIFFICULTY: __DIFFICULTY__ — the goal should need __STEPS__+ interaction steps.

Generate the complete Python code in a ```python block."""

TOOL_USE = r"""__CORPUS_SECTION__Create a tool-use environment by subclassing ToolUseBaseEnv.
The environment tests: __SKILL_NAME__ (__SKILL_DESCRIPTION__).

TASK CONCEPT IDEAS (pick one or invent your own):
__EXAMPLES__

WHAT YOU IMPLEMENT (the base class handles everything else):
  - reset(seed) -- generate data, define self._tools, set self._expected_answer
  - tool_xxx(**kwargs) -> str -- one method per simulated tool (prefix: tool_)
  - solution() -> str -- correct tool call sequence + final answer
  - get_tools() is auto-generated from self._tools by the base class (no override needed)

THE BASE CLASS ALREADY HANDLES:
  - <tool_call> JSON parsing and dispatch to your tool_xxx() methods
  - <answer> submission and checking via _check_answer()
  - Format error handling (returns -0.1 reward on bad format)
  - Available tools display in every observation
  - Turn counting, truncation, solution reveal on timeout
  Do NOT reimplement step(). Do NOT parse <tool_call> yourself.

AGENT ACTION FORMAT (handled by base class, for your reference):
  <tool_call>{"name": "tool_name", "arguments": {"key": "value"}}</tool_call>
  <answer>final result</answer>

RULES:
- Your class MUST inherit from ToolUseBaseEnv.
- Do NOT import ToolUseBaseEnv. It is already available in the namespace.
  Just write: class MyEnv(ToolUseBaseEnv):
- Only import standard library modules (random, json, re, math, etc.).
  Do NOT import any custom modules, utils, helpers, or external packages.
- Tools are SIMULATED as methods. No real API calls, no network, no subprocess.
- One task per episode. Task and data are fixed at reset().
- Give your class a descriptive, unique name ending with Env.
- The task must be solvable from the tool results alone.
- The observation from reset() must tell the agent what to find and the answer format.

INFORMATION HIDING:
- The observation describes the TASK but NOT the answer.
- The agent must call tools to discover information.
- NO SINGLE TOOL should return enough to solve the task alone.
  The agent MUST call 2-3 different tools and combine outputs.

STATEFUL ENVIRONMENT (CRITICAL):
- The environment MUST have mutable state (e.g., current_dir, balance, inventory,
  active_records, status flags) stored in self._state.
- Provide BOTH query tools (read state) AND mutation tools (modify state).
- Mutation tools MUST modify self._state and return success/error messages.
- Examples of stateful operations to model:
  * filesystem: cd, mkdir, mv, rm, touch, echo (changes current_dir + files)
  * trading: buy, sell, deposit, withdraw (changes balance + positions)
  * vehicle: startEngine, lockDoors, fillFuelTank (changes status flags)
  * messaging: send, delete, archive (changes message list)
  * booking: book, cancel, modify (changes reservations)
- The task MUST require AT LEAST 3 sequential dependent mutations:
  call_A → call_B (uses result of A) → call_C (uses state set by B)
- Mutation tools should ERROR or fail gracefully when called with wrong
  preconditions (e.g., mv before cd into right dir → 'file not found').
  This forces the agent to query state BEFORE mutating.

PRECISE EXECUTION (CRITICAL):
- Tool arguments must match EXACTLY. No extra content beyond what's requested.
- If task says 'write "hello" to file.txt', the agent MUST write exactly 'hello',
  not 'hello world' or 'Greetings: hello'. Verify content match in solution().
- The answer (or final state) is checked for EXACT match, not approximate.

__DIFFICULTY_TEXT__
TOOL DESIGN:
- Define 3-8 tools as tool_xxx() methods returning strings.
- Each tool takes simple args (str, int, float, bool).
- Tools must be DETERMINISTIC (no random inside tool methods).
- Include 1-2 tools that are NOT needed for the solution.
  Do NOT label them as unused in their descriptions.
- CRITICAL: tool method parameter names MUST EXACTLY MATCH the names
  declared in self._tools[name]['parameters']['properties']. If the
  schema says {'account': {...}}, the method MUST be
  `def tool_check(self, account=...)`. NOT `account_type`, NOT a
  renamed alias. Mismatched names cause every tool call to fail.
- Register tools in self._tools dict with description and parameters.
  Use OpenAI JSON Schema format for parameters:
    self._tools = {"search": {"description": "...", "parameters": {
      "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]
    }}}

SIMULATED DATA:
- Generate realistic mock data in reset() (10-50 records, not 2-3).
- Use random to vary data across seeds.
- The answer must be COMPUTED from data, never hardcoded.

ANSWER FORMAT:
- Prefer simple answers: a number, an ID, a comma-separated list.
- _check_answer() uses numeric tolerance (0.01) and case-insensitive match.
- Override _check_answer() if you need custom comparison logic.

ROBUSTNESS:
- Initialize ALL instance variables in __init__ before calling reset().
  Actually, ToolUseBaseEnv.__init__ does this. Just call super().__init__().
- Use self._expected_answer (not self.solution, which is a method).
- solution() is called on timeout. It MUST NOT crash.
- All randomness in reset() only, never in tool methods.
- When generating random-length data, use modular indexing to prevent IndexError.

TURN BUDGET:
- Task must be solvable within (max_turns - 2) tool calls.
- Do NOT require iterating over every record individually.

SELF-VERIFICATION:
- Trace reset(seed=42): what data is generated?
- What tools must be called to solve the task?
- Does solution() return the correct sequence + answer?

EXAMPLE STRUCTURE (stateful filesystem-like task):
```python
__EXAMPLE__```

Notice: each mutation depends on prior state (cd before mv, mkdir before mv).
Tools return errors when preconditions aren't met, forcing query-then-act.

Generate the complete Python code in a ```python block.
"""

TOOL_USE_MULTI_TURN = r"""Create a MULTI-TURN tool-use environment by subclassing ToolUseBaseEnv.
The environment tests: __SKILL_NAME__ (__SKILL_DESCRIPTION__).

THIS TASK MUST MIRROR THE STRUCTURE OF A REAL MULTI-TURN INTERACTION.
A real user does NOT describe the entire workflow up front. Instead, they
issue ONE atomic instruction, wait for it to be done, then issue the next.
Your env must reproduce this turn-by-turn structure.

──────────────────────────────────────────────────────────────────────────
WHAT YOU IMPLEMENT (the base class handles parsing/dispatch):

  - reset(seed) -- generate state, define self._tools, define
        self._user_messages (list of 3-5 atomic instruction strings),
        self._message_criteria (list of callables: state -> bool),
        self._current_msg = 0, self._expected_answer = "done".
        Return (self._user_messages[0], {})

  - tool_xxx(**kwargs) -> str -- one method per tool. After mutating
        state, EACH tool method must call self._advance_if_done() and
        APPEND its output to the tool result, like:
          base_result = "Moved file.pdf to /temp"
          progress = self._advance_if_done()  # appends next instruction or completion marker
          return base_result + progress

  - solution() -> str -- describe the full multi-turn solution

  - _advance_if_done(self) -> str -- helper you write yourself:
      ```
      def _advance_if_done(self):
          if self._current_msg >= len(self._user_messages):
              return ""
          criterion = self._message_criteria[self._current_msg]
          if criterion(self._state):
              self._current_msg += 1
              if self._current_msg >= len(self._user_messages):
                  return "\n\n[ALL STEPS COMPLETE] Submit <answer>done</answer>."
              next_msg = self._user_messages[self._current_msg]
              return f"\n\n[STEP {self._current_msg} COMPLETE — NEW INSTRUCTION] {next_msg}"
          return ""
      ```

  - Override _check_answer(answer) so it returns True only if
        answer == "done" AND self._current_msg == len(self._user_messages).

──────────────────────────────────────────────────────────────────────────
USER MESSAGE STRUCTURE (THE CORE OF MULTI-TURN):

self._user_messages must be 3-5 ATOMIC instructions, e.g.:
  [
    "Navigate to the document folder.",
    "Move final_report.pdf to a new 'temp' subdirectory.",
    "Now create an 'archive' folder and move all .txt files there.",
    "Finally, list the contents of the archive folder.",
  ]

self._message_criteria are callables that read self._state and return True
when the criterion is met:
  [
    lambda s: s["cwd"] == "/document",
    lambda s: "final_report.pdf" in s["tree"].get("/document/temp", []),
    lambda s: all(f in s["tree"].get("/document/archive", []) for f in s["txt_files"]),
    lambda s: s["last_ls_path"] == "/document/archive",
  ]

──────────────────────────────────────────────────────────────────────────
DOMAIN RULES (mirror BFCL multi_turn_base):

- Each user message is a SHORT, SPECIFIC, ATOMIC instruction (1-2 sentences).
- Do NOT describe the whole workflow in advance. The user reveals
  instructions ONE AT A TIME as previous ones are completed.
- Do NOT mention tool names, file structures, or implementation details
  in user messages. Use natural-language goals only.
- Each instruction's success criterion must be checkable from self._state.
- The actor must complete the CURRENT message before progressing. Trying
  to skip ahead won't reveal future messages.
- Allow 4-8 tool calls per message.

──────────────────────────────────────────────────────────────────────────
CRITICAL — SOLVABILITY & CRITERION CORRECTNESS (the single biggest source of BROKEN games):

A game is BROKEN if a success criterion cannot be satisfied by following its
instruction, or is already satisfied before the agent acts. Broken games waste
training and produce deadlocks. Obey ALL of these:

1. FALSE AT RESET / NOT FREE. Every criterion MUST require the agent to actually
   perform its instruction's action. For a WRITE instruction, the criterion must
   check the CHANGE it makes and be False on the state reset() returns — a
   criterion already True at reset (e.g. `s['inventory']['monitor'] >= 5` when
   monitor starts at 8, or `any('phone' in i for i in s['electronics'])` when a
   phone is already stocked) lets the agent skip the step for free. For a READ /
   VERIFY instruction ("check the line is active", "confirm the balance"), do NOT
   use a criterion that is already True at reset (e.g. `s['line_status']=='active'`
   when it starts 'active') — that advances on ANY tool call without the agent
   doing the read. Instead have the read tool record that it ran (e.g. set
   `s['last_checked']='line_status'`) and make the criterion check THAT flag, so
   the step requires actually calling the read tool.

2. TYPE-CORRECT. The criterion must read self._state with the SAME shape the
   tools write it. If order_history is a list of DICTS, check
   `any(o['item']=='laptop' for o in s['order_history'])`, NOT
   `'laptop' in s['order_history']` — string-in-list-of-dicts is ALWAYS False, so
   the step can NEVER complete and the game deadlocks. Type mismatches are the
   most common unsolvable-game bug.

3. DERIVABLE BY THE AGENT. Every value a criterion requires must be obtainable by
   the agent from EITHER (a) the words of its instruction, OR (b) a tool result it
   can read. NEVER hide an exact date / id / amount / threshold the instruction
   does not state and no tool reveals. BAD: instruction "schedule a visit next
   week" but criterion `s['last_updated'] >= '2024-01-22'` — the agent cannot know
   the threshold, must guess, and usually fails. FIX: state it in the instruction
   ("schedule for 2024-01-22 or later"), OR accept ANY valid action
   (`s['last_updated'] != '2024-01-15'`, i.e. any new date), OR have a tool reveal
   the value. Same for ids: if a criterion needs order '1024', the instruction
   must name it or a tool must return it.

4. EVERY REQUIRED TOOL CAN SUCCEED. For each instruction, the tool that satisfies
   its criterion must have a reachable success path. Trace the field the tool
   looks up — it must be a key some tool (or reset) actually SETS. BAD:
   tool_process_refund finds a refund by `r['refund_id']` but tool_create_refund
   never stores a 'refund_id' key → process_refund can NEVER succeed. If a tool
   reads an id/field, an earlier tool or reset MUST write that exact key.

5. INSTRUCTION MATCHES CRITERION. Each instruction must describe exactly what its
   criterion checks — no more, no less. Do NOT write "after the refund is
   processed, list inventory" if the criterion only checks that inventory was
   listed (and process_refund is broken/unneeded): the agent chases the
   irrelevant step and stalls.

6. SELF-TRACE BEFORE YOU FINISH (REQUIRED). Mentally run reset(seed=0), then
   execute your own solution() sequence step by step. After EACH solution step the
   matching criterion must flip False→True, IN ORDER, and no later criterion may be
   True yet; at the end self._current_msg must equal len(self._user_messages) and
   _check_answer("done") must be True. If any criterion is True at reset, never
   becomes True, or throws (KeyError/IndexError), the game is BROKEN — fix it
   before returning.

──────────────────────────────────────────────────────────────────────────
DIFFICULTY: __DIFFICULTY__

__DOMAIN_BLOCK__
__TASK_TYPE_BLOCK__
SKILL FOCUS: __SKILL_CATEGORY__
EXAMPLE TASKS (pick one or invent your own):
__EXAMPLES__

__CORPUS_SECTION__

──────────────────────────────────────────────────────────────────────────
RULES:
- Class MUST inherit from ToolUseBaseEnv.
- Do NOT import ToolUseBaseEnv. Just write: class MyEnv(ToolUseBaseEnv):
- Only standard library imports (random, json, re, math). No custom packages.
- Tools simulated as methods. No real APIs, network, or subprocess.
- Tools must be DETERMINISTIC. All randomness in reset() only.
- 3-8 tools as tool_xxx() methods returning strings.
- Give at least one tool a typed/constrained parameter using 'enum' and 'required' in its
  schema (e.g. status: {'type':'string','enum':['pending','shipped','cancelled']}).
- Include 1-2 DISTRACTOR tools: plausible but wrong for the task, so the agent must select
  the correct one from alternatives.
- Each tool ENDS with `return base_result + self._advance_if_done()`.
- Mutation tools must error gracefully on bad preconditions
  (e.g., mv without target dir → "Error: target dir not found").
- CRITICAL: tool method parameter names MUST EXACTLY MATCH the names declared
  in self._tools[name]['parameters']['properties']. If schema says
  {'account': {...}}, the method MUST be `def tool_check(self, account=...)`.
  NOT `account_type`, NOT `acct`, NOT a renamed alias. Mismatched names
  cause every tool call to fail with "got an unexpected keyword argument".

──────────────────────────────────────────────────────────────────────────
EXAMPLE STRUCTURE (multi-turn filesystem task):

```python
__EXAMPLE__```

Notice:
- self._user_messages defines the multi-turn STRUCTURE (BFCL-style)
- Each tool_xxx() ends with self._advance_if_done() so when criterion is met,
  the actor sees "[STEP N COMPLETE — NEW INSTRUCTION] ..." inline in the result
- _check_answer requires "done" AND all messages completed
- Reset returns ONLY the first instruction; the rest are revealed progressively

Generate the complete Python code in a ```python block.
"""

# What `__EXAMPLE_BLOCK__` becomes with `designer.prompt_example="complete"`
# (ours); with "skeleton" (the reference) it is empty, so these two prompts
# show only their interface skeleton.
SINGLE_TURN_EXAMPLE_BLOCK = r"""REFERENCE EXAMPLE — a complete game in this format (shows the pattern; yours must be DIFFERENT):
```python
__EXAMPLE__```

"""

CORPUS_EXAMPLE_BLOCK = r"""REFERENCE EXAMPLE — a complete interactive environment grounded in one concept (binary search); shows the pattern, yours must come from the document above and be DIFFERENT:
```python
__EXAMPLE__```

"""

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

# spade/core/hint_generator.py: HINT_SYSTEM_PROMPT (games).
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
