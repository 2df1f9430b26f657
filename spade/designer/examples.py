"""Complete example programs shown in the designer prompts, one a family.

Each is a whole environment program in the reference implementation's
format (`spade-rl/spade`, `spade/core/prompts/`): the multi-turn game and both
tool-use programs are the reference's own examples (imports and a class
docstring added so each file stands alone), shown in every prompt of their
family; the single-turn and the corpus-grounded ones are written here in the
same format and shown only with `designer.prompt_example="complete"` (ours),
since the reference shows only an interface skeleton for them. They are kept as
4-space-indented text, the style the models were trained on, and every one
passes `python -m spade.environments.check`
(tests/designer/test_design_prompts.py).
"""

SINGLE_TURN_GAME = r'''import random
import re
from typing import Tuple
from math_verify import parse, verify


def verify_answer(player_answer, solution):
    """Check if answer is correct: string match first, then math equivalence."""
    if str(player_answer).strip() == str(solution).strip():
        return True
    try:
        return verify(parse(player_answer), parse(solution))
    except Exception:
        return False


class ClockChainEnv:
    """Apply a chain of clock-arithmetic operations to a start value and report the final reading."""

    def __init__(self, max_turns=10, **kwargs):
        self.max_turns = max_turns
        self.turn_count = 0
        self.start = 0
        self.modulus = 12
        self.ops = []
        self._answer = 0
        self.reset()

    def reset(self, seed=None) -> Tuple[str, dict]:
        rng = random.Random(seed)
        self.turn_count = 0
        self.modulus = rng.randint(17, 61)
        self.start = rng.randint(1, self.modulus - 1)
        self.ops = [(rng.choice(['add', 'multiply by', 'subtract']), rng.randint(2, 40))
                    for _ in range(4)]
        value = self.start
        for op, n in self.ops:
            if op == 'add':
                value = (value + n) % self.modulus
            elif op == 'subtract':
                value = (value - n) % self.modulus
            else:
                value = (value * n) % self.modulus
        self._answer = value
        return self._task(), {}

    def _task(self) -> str:
        steps = ', then '.join(f'{op} {n}' for op, n in self.ops)
        return (f'A clock has {self.modulus} positions (0 to {self.modulus - 1}) and starts at '
                f'{self.start}. Apply in order: {steps}, wrapping around the clock after each '
                'operation. Where does the hand end? Answer with \\boxed{position}.')

    def solution(self) -> str:
        return str(self._answer)

    def step(self, action: str) -> Tuple[str, float, bool, bool, dict]:
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r'\\boxed\{([^}]+)\}', action)
        if match and verify_answer(match.group(1), self.solution()):
            return ('Correct! The hand ends at ' + self.solution() + '.', 1.0, True, False, {})
        if truncated:
            return (f"Time's up. The answer was {self.solution()}.", 0.0, False, True, {})
        if not match:
            return ('Reply with your answer as \\boxed{position}. ' + self._task(), 0.0, False, False, {})
        guess = match.group(1).strip()
        if not guess.lstrip('-').isdigit():
            feedback = f'{guess!r} is not a position on the clock.'
        elif int(guess) < self._answer:
            feedback = f'{guess} is too low.'
        else:
            feedback = f'{guess} is too high.'
        return (f'Wrong. {feedback} Try again. ' + self._task(), 0.0, False, False, {})

    def close(self):
        pass
'''

MULTI_TURN_GAME = r'''import random
import re
from typing import Tuple


class TradingGameEnv:
    """Buy low, sell high across rounds with fluctuating prices. Reach target gold."""
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
        self.turn_count = 0
        self.gold = 0
        self.stock = 0
        self.price = 0
        self.price_history = []
        self.target_gold = 0
        self.trend = 0  # hidden: +1 rising, -1 falling
        self.reset()

    def reset(self, seed=None):
        if seed is not None:
            random.seed(seed)
        self.turn_count = 0
        self.gold = 100
        self.stock = 0
        self.price = random.randint(8, 15)
        self.price_history = [self.price]
        self.target_gold = 200
        self.trend = random.choice([-1, 1])
        return (f'Welcome to the Trading Game! Reach {self.target_gold} gold to win.\n'
                f'Price: {self.price} | Gold: {self.gold} | Stock: {self.stock}\n'
                f'History: {self.price_history}\n'
                f'Turn 0/{self.max_turns}\n'
                f'Actions: \\boxed{{buy N}}, \\boxed{{sell N}}, \\boxed{{wait}}'), {}

    def step(self, action):
        self.turn_count += 1
        match = re.search(r'\\boxed\{([^}]*)\}', action)
        if not match:
            return ('Use \\boxed{action} format.', 0.0, False, False, {})
        cmd = match.group(1).strip().lower()
        truncated = self.turn_count >= self.max_turns
        msg = ''
        # Parse action
        if cmd.startswith('buy '):
            try:
                n = int(cmd[4:])
                cost = n * self.price
                if cost <= self.gold and n > 0:
                    self.gold -= cost
                    self.stock += n
                    msg = f'Bought {n} at {self.price}.'
                else:
                    msg = f'Cannot buy {n} (need {cost} gold, have {self.gold}).'
            except ValueError:
                msg = 'Invalid number.'
        elif cmd.startswith('sell '):
            try:
                n = int(cmd[5:])
                if n <= self.stock and n > 0:
                    self.gold += n * self.price
                    self.stock -= n
                    msg = f'Sold {n} at {self.price}.'
                else:
                    msg = f'Cannot sell {n} (have {self.stock}).'
            except ValueError:
                msg = 'Invalid number.'
        elif cmd == 'wait':
            msg = 'You wait.'
        else:
            msg = 'Unknown action.'
        # Update price with trend + noise
        if random.random() < 0.3:  # trend reversal
            self.trend *= -1
        self.price = max(1, self.price + self.trend * random.randint(1, 4))
        self.price_history.append(self.price)
        # Check win
        total = self.gold + self.stock * self.price
        if self.gold >= self.target_gold:
            return (f'{msg} Gold: {self.gold}. You win!', 1.0, True, False, {})
        if truncated:
            return (f'{msg} Time up. Gold: {self.gold}, Stock: {self.stock}. Needed {self.target_gold}.', 0.0, False, True, {})
        obs = (f'{msg}\nPrice: {self.price} | Gold: {self.gold} | Stock: {self.stock}\n'
               f'History: {self.price_history[-5:]}\n'
               f'Turn {self.turn_count}/{self.max_turns}\n'
               f'Actions: \\boxed{{buy N}}, \\boxed{{sell N}}, \\boxed{{wait}}')
        return (obs, 0.0, False, False, {})

    def close(self): pass
'''

CORPUS_GAME = r'''import random
import re
from typing import Tuple


class VaultBinarySearchEnv:
    """Find the drawer holding a target code in a row of sorted drawers by opening as few drawers as possible (binary search)."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
        self.turn_count = 0
        self.codes = []
        self.target = 0
        self.opened = {}
        self.probes_left = 0
        self.reset()

    def reset(self, seed=None) -> Tuple[str, dict]:
        rng = random.Random(seed)
        self.turn_count = 0
        size = rng.randint(40, 60)
        self.codes = sorted(rng.sample(range(100, 1000), size))
        self.target = rng.choice(self.codes)
        self.opened = {}
        self.probes_left = 7
        return (f'A vault has {size} drawers numbered 0 to {size - 1}. Each holds a code, and the '
                'codes increase from drawer to drawer, but you cannot see them. '
                f'Find the drawer that holds code {self.target}. You may open at most '
                f'{self.probes_left} drawers.\n' + self._status()), {}

    def _status(self) -> str:
        seen = ', '.join(f'#{i}={c}' for i, c in sorted(self.opened.items())) or 'none'
        return (f'Opened: {seen} | Openings left: {self.probes_left} | '
                f'Turn {self.turn_count}/{self.max_turns}\n'
                'Actions: \\boxed{open N} to see drawer N, \\boxed{claim N} when you know the drawer.')

    def step(self, action: str) -> Tuple[str, float, bool, bool, dict]:
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        m = re.search(r'\\boxed\{(.+?)\}', action)
        cmd = (m.group(1) if m else action).strip().lower()
        parts = cmd.split()
        if len(parts) != 2 or parts[0] not in ('open', 'claim') or not parts[1].isdigit():
            return ('Unknown action. ' + self._status(), 0.0, False, truncated, {})
        n = int(parts[1])
        if n >= len(self.codes):
            return (f'There is no drawer {n}. ' + self._status(), 0.0, False, truncated, {})
        if parts[0] == 'claim':
            if self.codes[n] == self.target:
                return (f'Drawer {n} holds {self.target}. The vault opens!', 1.0, True, False, {})
            return (f'Drawer {n} holds {self.codes[n]}, not {self.target}. The alarm sounds.',
                    0.0, True, False, {})
        if self.probes_left == 0:
            return ('No openings left; you must claim a drawer. ' + self._status(),
                    0.0, False, truncated, {})
        self.probes_left -= 1
        self.opened[n] = self.codes[n]
        return (f'Drawer {n} holds {self.codes[n]}.\n' + self._status(), 0.0, False, truncated, {})

    def solution(self) -> str:
        lo, hi, moves = 0, len(self.codes) - 1, []
        while lo <= hi:
            mid = (lo + hi) // 2
            moves.append(f'\\boxed{{open {mid}}}')
            if self.codes[mid] == self.target:
                break
            if self.codes[mid] < self.target:
                lo = mid + 1
            else:
                hi = mid - 1
        moves.append(f'\\boxed{{claim {self.codes.index(self.target)}}}')
        return ' '.join(moves)

    def close(self):
        pass
'''

TOOL_USE = r'''import random
import json
from typing import Tuple
# Do NOT import ToolUseBaseEnv -- it is pre-loaded in the namespace

class FileOrganizerEnv(ToolUseBaseEnv):
    """Move a report into a new archive folder with file-system tools, then submit its path."""

    def reset(self, seed=None) -> Tuple[str, dict]:
        self.turn_count = 0
        self._call_history = []
        if seed is not None:
            random.seed(seed)
        # Stateful environment: directory tree + current location
        self._state = {
            'cwd': '/home',
            'tree': {
                '/home': ['docs', 'temp.txt'],
                '/home/docs': ['report.txt', 'notes.txt'],
            },
        }
        self._tools = {
            'pwd': {'description': 'Get current directory', 'parameters': {'type':'object','properties':{}}},
            'ls': {'description': 'List current directory', 'parameters': {'type':'object','properties':{}}},
            'cd': {'description': 'Change directory', 'parameters': {'type':'object','properties':{'path':{'type':'string'}},'required':['path']}},
            'mkdir': {'description': 'Create directory in current location', 'parameters': {'type':'object','properties':{'name':{'type':'string'}},'required':['name']}},
            'mv': {'description': 'Move file from current dir to subdir', 'parameters': {'type':'object','properties':{'src':{'type':'string'},'dst':{'type':'string'}},'required':['src','dst']}},
        }
        # Task: requires sequential mutations (cd → mkdir → mv)
        self._expected_answer = 'archive/report.txt'
        return ('TASK: Move report.txt from /home/docs into a new subdirectory '
                'called "archive". Submit final path with <answer>PATH</answer>.', {})

    def tool_pwd(self) -> str:
        return self._state['cwd']

    def tool_ls(self) -> str:
        return json.dumps(self._state['tree'].get(self._state['cwd'], []))

    def tool_cd(self, path='') -> str:
        target = path if path.startswith('/') else f"{self._state['cwd']}/{path}"
        if target not in self._state['tree']:
            return f'Error: directory {target} not found'  # forces query first
        self._state['cwd'] = target
        return f'Changed to {target}'

    def tool_mkdir(self, name='') -> str:
        new_path = f"{self._state['cwd']}/{name}"
        if new_path in self._state['tree']:
            return f'Error: {new_path} already exists'
        self._state['tree'][new_path] = []
        self._state['tree'][self._state['cwd']].append(name)
        return f'Created {new_path}'

    def tool_mv(self, src='', dst='') -> str:
        cwd_files = self._state['tree'].get(self._state['cwd'], [])
        if src not in cwd_files:
            return f'Error: {src} not in current dir'  # forces cd first
        dst_path = f"{self._state['cwd']}/{dst}"
        if dst_path not in self._state['tree']:
            return f'Error: destination {dst_path} not found'  # forces mkdir first
        cwd_files.remove(src)
        self._state['tree'][dst_path].append(src)
        return f'Moved {src} to {dst}'

    def solution(self) -> str:
        # 3 dependent mutations: cd → mkdir → mv
        return ('1. cd(path="docs") -> Changed to /home/docs '
                '2. mkdir(name="archive") -> Created /home/docs/archive '
                '3. mv(src="report.txt", dst="archive") -> Moved '
                'ANSWER: archive/report.txt')
'''

TOOL_USE_MULTI_TURN = r'''import random
import json
from typing import Tuple

class FileWorkflowMTEnv(ToolUseBaseEnv):
    """Follow a user's file-system instructions, revealed one at a time, then submit done."""

    def reset(self, seed=None) -> Tuple[str, dict]:
        self.turn_count = 0
        self._call_history = []
        if seed is not None:
            random.seed(seed)
        self._state = {
            'cwd': '/home',
            'tree': {
                '/home': ['document', 'temp.txt'],
                '/home/document': ['report.txt', 'notes.txt', 'log.txt'],
            },
            'last_ls_path': None,
        }
        self._tools = {
            'pwd': {'description': 'Show current dir', 'parameters': {'type':'object','properties':{}}},
            'ls': {'description': 'List a directory', 'parameters': {'type':'object','properties':{'path':{'type':'string'}}, 'required':['path']}},
            'cd': {'description': 'Change dir', 'parameters': {'type':'object','properties':{'path':{'type':'string'}}, 'required':['path']}},
            'mkdir': {'description': 'Create a subdirectory in current dir', 'parameters': {'type':'object','properties':{'name':{'type':'string'}}, 'required':['name']}},
            'mv': {'description': 'Move file from current dir to a destination dir', 'parameters': {'type':'object','properties':{'src':{'type':'string'},'dst':{'type':'string'}}, 'required':['src','dst']}},
        }
        self._user_messages = [
            "Navigate to the document folder.",
            "Create a 'temp' subdirectory and move report.txt into it.",
            "Now list what's in the temp folder.",
        ]
        self._message_criteria = [
            lambda s: s['cwd'] == '/home/document',
            lambda s: 'report.txt' in s['tree'].get('/home/document/temp', []),
            lambda s: s['last_ls_path'] == '/home/document/temp',
        ]
        self._current_msg = 0
        self._expected_answer = "done"
        return (self._user_messages[0], {})

    def _advance_if_done(self) -> str:
        if self._current_msg >= len(self._user_messages):
            return ""
        if self._message_criteria[self._current_msg](self._state):
            self._current_msg += 1
            if self._current_msg >= len(self._user_messages):
                return "\n\n[ALL STEPS COMPLETE] Submit <answer>done</answer>."
            next_msg = self._user_messages[self._current_msg]
            return f"\n\n[STEP {self._current_msg} COMPLETE — NEW INSTRUCTION] {next_msg}"
        return ""

    def _check_answer(self, answer: str) -> bool:
        return answer.strip().lower() == 'done' and self._current_msg >= len(self._user_messages)

    def tool_pwd(self) -> str:
        return self._state['cwd'] + self._advance_if_done()

    def tool_ls(self, path='') -> str:
        if path not in self._state['tree']:
            return f"Error: {path} not found" + self._advance_if_done()
        self._state['last_ls_path'] = path
        out = json.dumps(self._state['tree'][path])
        return out + self._advance_if_done()

    def tool_cd(self, path='') -> str:
        if path not in self._state['tree']:
            return f"Error: {path} not found" + self._advance_if_done()
        self._state['cwd'] = path
        return f"Changed to {path}" + self._advance_if_done()

    def tool_mkdir(self, name='') -> str:
        new_path = f"{self._state['cwd']}/{name}"
        if new_path in self._state['tree']:
            return f"Error: {new_path} exists" + self._advance_if_done()
        self._state['tree'][new_path] = []
        self._state['tree'][self._state['cwd']].append(name)
        return f"Created {new_path}" + self._advance_if_done()

    def tool_mv(self, src='', dst='') -> str:
        cwd_files = self._state['tree'].get(self._state['cwd'], [])
        if src not in cwd_files:
            return f"Error: {src} not in current dir" + self._advance_if_done()
        dst_path = f"{self._state['cwd']}/{dst}"
        if dst_path not in self._state['tree']:
            return f"Error: target {dst} not found" + self._advance_if_done()
        cwd_files.remove(src)
        self._state['tree'][dst_path].append(src)
        return f"Moved {src} to {dst}" + self._advance_if_done()

    def solution(self) -> str:
        return ("1. cd(path='/home/document') 2. mkdir(name='temp') "
                "3. mv(src='report.txt', dst='temp') 4. ls(path='/home/document/temp') "
                "5. <answer>done</answer>")
'''

BY_FAMILY = {
    "single_turn_game": SINGLE_TURN_GAME,
    "multi_turn_game": MULTI_TURN_GAME,
    "corpus_game": CORPUS_GAME,
    "tool_use": TOOL_USE,
    "tool_use_multi_turn": TOOL_USE_MULTI_TURN,
}
