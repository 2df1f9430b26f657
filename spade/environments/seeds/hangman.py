"""Seed environment (language): guess a word letter by letter."""

import random
import re
import string


def _boxed(action):
  found = re.findall(r"\\boxed\{([^{}]*)\}", action)
  return found[-1].strip().lower() if found else None


_WORDS = [
    "asteroid",
    "blizzard",
    "carousel",
    "dinosaur",
    "elephant",
    "flamingo",
    "gorgeous",
    "hedgehog",
    "junction",
    "kangaroo",
    "labyrinth",
    "mackerel",
    "necklace",
    "overture",
    "pendulum",
    "quarters",
    "railroad",
    "sapphire",
    "tortoise",
    "umbrella",
    "volcanic",
    "wildfire",
    "xylophone",
    "zeppelin",
]


class HangmanEnv:
  """Guess a hidden word one letter at a time before five misses.

  Correct letters are revealed in place. Guessing the whole word is allowed;
  a wrong whole-word guess loses at once.
  """

  def __init__(self, max_turns=20, **kwargs):
    self.max_turns = max_turns
    self.reset()

  def reset(self, seed=None):
    rng = random.Random(seed)
    self._word = rng.choice(_WORDS)
    self._guessed = set()
    self._misses = 0
    self.turn_count = 0
    self._done = False
    return (
        "Hangman. Guess letters with \\boxed{e} or the whole word with"
        " \\boxed{word}. Five misses lose.\n" + self._show()
    ), {}

  def _show(self):
    shown = " ".join(c if c in self._guessed else "_" for c in self._word)
    tried = "".join(sorted(self._guessed)) or "-"
    return f"Word: {shown}  Tried: {tried}  Misses: {self._misses}/5"

  def step(self, action):
    if self._done:
      return "The game is over.", 0.0, True, False, {}
    self.turn_count += 1
    g = _boxed(action)
    if g == self._word:
      self._done = True
      return f"Yes, the word is {self._word}!", 1.0, True, False, {}
    if g is None or not g or any(c not in string.ascii_lowercase for c in g):
      msg = "Reply with one letter (or the word) inside \\boxed{}."
    elif len(g) > 1:
      self._done = True
      return f"'{g}' is wrong; the word was {self._word}.", 0.0, True, False, {}
    elif g in self._guessed:
      msg = f"You already tried '{g}'."
    else:
      self._guessed.add(g)
      if g in self._word:
        msg = f"'{g}' is in the word."
        if set(self._word) <= self._guessed:
          self._done = True
          return f"You found {self._word}!", 1.0, True, False, {}
      else:
        self._misses += 1
        msg = f"No '{g}'."
        if self._misses >= 5:
          self._done = True
          return f"{msg} Hanged; it was {self._word}.", 0.0, True, False, {}
    if self.turn_count >= self.max_turns:
      self._done = True
      return f"{msg} Out of turns.", 0.0, False, True, {}
    return f"{msg}\n{self._show()}", 0.0, False, False, {}

  def hint(self):
    w = self._word
    return f"The word has {len(w)} letters and starts with '{w[0]}'."

  def solution(self):
    letters = sorted(set(self._word) - self._guessed)
    return [f"\\boxed{{{c}}}" for c in letters]

  def close(self):
    pass
