"""Seed environment (pattern): continue a hidden integer sequence."""

import random
import re


def _boxed(action):
  found = re.findall(r"\\boxed\{([^{}]*)\}", action)
  return found[-1].strip() if found else None


class SequenceNextEnv:
  """Work out the rule behind a sequence and give its next three terms.

  Five terms are shown; the player answers one term per turn. A right answer
  reveals it and moves on; three wrong answers lose the game.
  """

  def __init__(self, max_turns=8, **kwargs):
    self.max_turns = max_turns
    self.reset()

  def reset(self, seed=None):
    rng = random.Random(seed)
    kind = rng.choice(["arith2", "geom", "fib", "square", "alt"])
    a, b = rng.randint(2, 9), rng.randint(2, 7)
    if kind == "arith2":  # second differences constant
      seq = [a]
      step = b
      for _ in range(7):
        seq.append(seq[-1] + step)
        step += a
    elif kind == "geom":
      seq = [a * b**i + i for i in range(8)]
    elif kind == "fib":
      seq = [a, b]
      while len(seq) < 8:
        seq.append(seq[-1] + seq[-2])
    elif kind == "square":
      seq = [(i + a) ** 2 - b for i in range(8)]
    else:
      seq = [a]
      for i in range(7):
        seq.append(seq[-1] * 2 if i % 2 == 0 else seq[-1] - b)
    self._kind = kind
    self._seq = seq
    self._known = 5
    self._lives = 3
    self.turn_count = 0
    self._done = False
    return (
        "Sequence. Find the rule and continue the sequence:"
        f" {self._shown()}. Give the next term as \\boxed{{N}}, one term per"
        " turn; you must find three more terms. Three wrong answers lose."
    ), {}

  def _shown(self):
    return ", ".join(str(x) for x in self._seq[: self._known]) + ", ?"

  def step(self, action):
    if self._done:
      return "The game is over.", 0.0, True, False, {}
    self.turn_count += 1
    ans = _boxed(action)
    target = self._seq[self._known]
    if ans is None:
      msg = "Put one integer inside \\boxed{}."
    elif ans.lstrip("-").isdigit() and int(ans) == target:
      self._known += 1
      if self._known == 8:
        self._done = True
        return f"Right: {target}. Sequence complete!", 1.0, True, False, {}
      msg = f"Right: {target}."
    else:
      self._lives -= 1
      msg = f"{ans} is wrong."
      if self._lives == 0:
        self._done = True
        return f"{msg} No lives left.", 0.0, True, False, {}
    if self.turn_count >= self.max_turns:
      self._done = True
      return f"{msg} Out of turns.", 0.0, False, True, {}
    return (
        f"{msg} Sequence: {self._shown()} Lives: {self._lives}.",
        0.0,
        False,
        False,
        {},
    )

  def hint(self):
    names = {
        "arith2": "the differences grow by a constant",
        "geom": "each term is a*b^i + i",
        "fib": "each term is the sum of the two before it",
        "square": "terms are consecutive squares minus a constant",
        "alt": "alternately double, then subtract a constant",
    }
    return f"Rule: {names[self._kind]}."

  def solution(self):
    return [f"\\boxed{{{x}}}" for x in self._seq[self._known :]]

  def close(self):
    pass
