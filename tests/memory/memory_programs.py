"""Environment programs for the memory tests, written for them.

Four genuinely different games in the environment contract, and helpers that
make variants of a program.
"""

import ast

GUESS = '''
import random


class GuessNumberEnv:
  """Guess a secret number between 1 and 100; each reply says higher or lower."""

  def __init__(self, max_turns=7, **kwargs):
    self.max_turns = max_turns
    self.secret = None
    self.turns = 0

  def reset(self, seed=None):
    rng = random.Random(seed)
    self.secret = rng.randint(1, 100)
    self.turns = 0
    return "Guess a number between 1 and 100, as \\\\boxed{n}.", {}

  def step(self, action):
    self.turns += 1
    found = re.search(r"\\\\boxed\\{(\\d+)\\}", action)
    done = self.turns >= self.max_turns
    if not found:
      return "Reply with \\\\boxed{n}.", -0.1, False, done, {}
    guess = int(found.group(1))
    if guess == self.secret:
      return "Correct!", 1.0, True, False, {}
    direction = "higher" if guess < self.secret else "lower"
    return f"Go {direction}.", 0.0, False, done, {}

  def hint(self):
    return f"The secret is {self.secret}."

  def solution(self):
    return [f"\\\\boxed{{{self.secret}}}"]
'''

HANOI = '''
class TowerOfHanoiEnv:
  """Move a stack of disks from peg A to peg C, never a larger on a smaller."""

  def __init__(self, max_turns=40, disks=3, **kwargs):
    self.max_turns = max_turns
    self.disks = disks

  def reset(self, seed=None):
    self.pegs = {"A": list(range(self.disks, 0, -1)), "B": [], "C": []}
    self.moves = 0
    return self._show(), {}

  def _show(self):
    return " | ".join(f"{k}: {v}" for k, v in self.pegs.items())

  def step(self, action):
    self.moves += 1
    pair = re.findall(r"[ABC]", action.upper())
    if len(pair) < 2:
      return "Say a move like A->C.", -0.1, False, self.moves >= self.max_turns, {}
    src, dst = pair[0], pair[1]
    if not self.pegs[src] or (self.pegs[dst] and self.pegs[dst][-1] < self.pegs[src][-1]):
      return "Illegal move. " + self._show(), -0.1, False, self.moves >= self.max_turns, {}
    self.pegs[dst].append(self.pegs[src].pop())
    if len(self.pegs["C"]) == self.disks:
      return "Solved!", 1.0, True, False, {}
    return self._show(), 0.0, False, self.moves >= self.max_turns, {}

  def hint(self):
    return "Move the smallest disk every other turn, always in the same direction."
'''

WORDS = '''
import random

WORDS = ["planet", "garden", "silver", "candle", "rocket", "forest"]


class AnagramEnv:
  """Unscramble a shuffled English word within three attempts."""

  def __init__(self, max_turns=3, **kwargs):
    self.max_turns = max_turns

  def reset(self, seed=None):
    rng = random.Random(seed)
    self.word = rng.choice(WORDS)
    letters = list(self.word)
    while "".join(letters) == self.word:
      rng.shuffle(letters)
    self.attempts = 0
    return "Unscramble: " + "".join(letters), {}

  def step(self, action):
    self.attempts += 1
    answer = action.strip().lower().split()[-1] if action.strip() else ""
    if answer == self.word:
      return "Right.", 1.0, True, False, {}
    return "No.", 0.0, False, self.attempts >= self.max_turns, {}

  def hint(self):
    return "It starts with " + self.word[0]
'''

ARITH = '''
class RunningSumEnv:
  """Keep a running total: each turn adds a number; report the sum at the end."""

  def __init__(self, max_turns=6, **kwargs):
    self.max_turns = max_turns

  def reset(self, seed=None):
    state = (seed or 0) * 7919 % 1000
    self.values = [(state * (k + 3)) % 50 for k in range(4)]
    self.index = 0
    return f"Remember {self.values[0]}. Reply ok.", {}

  def step(self, action):
    self.index += 1
    if self.index < len(self.values):
      return f"Add {self.values[self.index]}. Reply ok.", 0.0, False, False, {}
    try:
      total = int(action.strip().split()[-1])
    except (ValueError, IndexError):
      return "Not a number.", 0.0, True, False, {}
    won = total == sum(self.values)
    return ("Correct." if won else "Wrong."), float(won), True, False, {}
'''

ALL = (GUESS, HANOI, WORDS, ARITH)


class _Rename(ast.NodeTransformer):

  def __init__(self, mapping):
    self.mapping = mapping

  def _r(self, name):
    return self.mapping.get(name, name)

  def generic_visit(self, node):
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
      node.name = self._r(node.name)
    elif isinstance(node, ast.Name):
      node.id = self._r(node.id)
    elif isinstance(node, ast.arg):
      node.arg = self._r(node.arg)
    elif isinstance(node, ast.Attribute):
      node.attr = self._r(node.attr)
    return super().generic_visit(node)


def renamed(code: str, mapping: dict[str, str]) -> str:
  """The program with identifiers renamed and re-printed (comments lost)."""
  return ast.unparse(_Rename(mapping).visit(ast.parse(code)))


def numbered(k: int) -> str:
  """A distinct small program per k (a different constant table)."""
  table = ", ".join(str((k * 37 + i * 11) % 97) for i in range(24))
  return (
      f'class Table{k}Env:\n  """Look up entry {k}."""\n\n'
      f"  TABLE = [{table}]\n\n"
      "  def reset(self, seed=None):\n    return 'go', {}\n"
  )
