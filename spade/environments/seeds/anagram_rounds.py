"""Seed environment (language): unscramble three words in a row."""

import random
import re


def _boxed(action):
  found = re.findall(r"\\boxed\{([^{}]*)\}", action)
  return found[-1].strip().lower() if found else None


_WORDS = [
    "planet",
    "garden",
    "silver",
    "rocket",
    "bridge",
    "candle",
    "forest",
    "winter",
    "marble",
    "pencil",
    "orange",
    "castle",
    "jungle",
    "ladder",
    "mirror",
    "pocket",
    "spider",
    "tunnel",
    "violet",
    "wizard",
    "anchor",
    "basket",
    "cactus",
    "dragon",
    "falcon",
    "goblin",
    "helmet",
    "island",
]


class AnagramRoundsEnv:
  """Unscramble three six-letter words, one per round.

  A wrong answer reveals nothing and costs a life; two lives in all.
  """

  def __init__(self, max_turns=6, **kwargs):
    self.max_turns = max_turns
    self.reset()

  def reset(self, seed=None):
    rng = random.Random(seed)
    self._words = rng.sample(_WORDS, 3)
    self._scrambled = []
    for w in self._words:
      letters = list(w)
      while "".join(letters) == w:
        rng.shuffle(letters)
      self._scrambled.append("".join(letters).upper())
    self._round = 0
    self._lives = 2
    self.turn_count = 0
    self._done = False
    return (
        "Anagrams. Unscramble each word and answer like \\boxed{word}."
        f" Two lives.\n{self._show()}"
    ), {}

  def _show(self):
    return f"Round {self._round + 1}/3: {self._scrambled[self._round]}"

  def step(self, action):
    if self._done:
      return "The game is over.", 0.0, True, False, {}
    self.turn_count += 1
    if _boxed(action) == self._words[self._round]:
      self._round += 1
      if self._round == 3:
        self._done = True
        return "Correct! All three solved.", 1.0, True, False, {}
      msg = "Correct."
    else:
      self._lives -= 1
      msg = "Not the word."
      if self._lives == 0:
        self._done = True
        return (
            f"{msg} It was '{self._words[self._round]}'.",
            0.0,
            True,
            False,
            {},
        )
    if self.turn_count >= self.max_turns:
      self._done = True
      return f"{msg} Out of turns.", 0.0, False, True, {}
    return f"{msg} Lives: {self._lives}.\n{self._show()}", 0.0, False, False, {}

  def hint(self):
    return f"The first word starts with '{self._words[self._round][0]}'."

  def solution(self):
    return [f"\\boxed{{{w}}}" for w in self._words[self._round :]]

  def close(self):
    pass
