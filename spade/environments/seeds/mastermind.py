"""Seed environment (pattern): Mastermind with four digits."""

import itertools
import random
import re


def _boxed(action):
  found = re.findall(r"\\boxed\{([^{}]*)\}", action)
  return found[-1].strip() if found else None


def _score(guess, code):
  exact = sum(g == c for g, c in zip(guess, code))
  common = sum(min(guess.count(d), code.count(d)) for d in set(guess))
  return exact, common - exact


class MastermindEnv:
  """Guess a hidden code of four digits, each 1-6, within ten guesses.

  After each guess the game says how many digits are right and in the right
  place (exact) and how many are right but misplaced (partial).
  """

  def __init__(self, max_turns=10, **kwargs):
    self.max_turns = max_turns
    self.reset()

  def reset(self, seed=None):
    rng = random.Random(seed)
    self._code = "".join(rng.choice("123456") for _ in range(4))
    self.turn_count = 0
    self._done = False
    self._history = []
    return (
        "Mastermind. A secret code of 4 digits, each from 1 to 6 (repeats"
        " allowed), is hidden. Guess it: reply with \\boxed{1234}. After each"
        " guess you learn 'exact' (right digit, right place) and 'partial'"
        f" (right digit, wrong place). You have {self.max_turns} guesses."
    ), {}

  def step(self, action):
    if self._done:
      return "The game is over.", 0.0, True, False, {}
    self.turn_count += 1
    guess = _boxed(action)
    left = self.max_turns - self.turn_count
    if guess is None or not re.fullmatch(r"[1-6]{4}", guess):
      msg = "Reply with four digits 1-6 inside \\boxed{}, e.g. \\boxed{1122}."
    elif guess == self._code:
      self._done = True
      return f"{guess}: 4 exact. You cracked the code!", 1.0, True, False, {}
    else:
      exact, partial = _score(guess, self._code)
      self._history.append(f"{guess}: exact={exact} partial={partial}")
      msg = f"{guess}: exact={exact} partial={partial}."
    if left <= 0:
      self._done = True
      return (
          f"{msg} Out of guesses; the code was {self._code}.",
          0.0,
          False,
          True,
          {},
      )
    history = "; ".join(self._history[-10:])
    return (
        f"{msg} Guesses so far: {history}. {left} left.",
        0.0,
        False,
        False,
        {},
    )

  def hint(self):
    return f"The first digit of the code is {self._code[0]}."

  def solution(self):
    # A consistent-guess strategy: always play the first code that agrees
    # with every answer so far; it needs at most 8 guesses here.
    candidates = ["".join(p) for p in itertools.product("123456", repeat=4)]
    guess, plan = "1122", []
    while True:
      plan.append(f"\\boxed{{{guess}}}")
      if guess == self._code:
        return plan
      fb = _score(guess, self._code)
      candidates = [c for c in candidates if _score(guess, c) == fb]
      guess = candidates[0]

  def close(self):
    pass
