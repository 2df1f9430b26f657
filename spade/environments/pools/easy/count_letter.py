"""Easy environment: count one letter in a word, with a second try.

Part of the pool sized for a 0.5B model (configs/qwen2p5_coder_0p5b.py
`agent_curve`): a word of 6-11 letters with the letter one to three times;
a wrong first count is told so and may be corrected once.
"""

import random
import re

_WORDS = (
    "strawberry",
    "banana",
    "committee",
    "balloon",
    "mississippi",
    "pepper",
    "letter",
    "bookkeeper",
    "coffee",
    "parallel",
    "success",
    "assessment",
    "butterfly",
    "tomorrow",
    "excellent",
    "address",
)


def _count(action):
  found = re.findall(r"\\boxed\{\s*(\d+)\s*\}", action)
  return int(found[-1]) if found else None


class CountLetterEnv:
  """Reply with how many times the letter occurs in the word; two tries."""

  def __init__(self, max_turns=2, **kwargs):
    self.max_turns = max_turns
    self.reset()

  def reset(self, seed=None):
    rng = random.Random(seed)
    self._word = rng.choice(_WORDS)
    self._letter = rng.choice(sorted(set(self._word)))
    self.turn_count = 0
    self._done = False
    return (
        f'How many times does the letter "{self._letter}" occur in the word'
        f' "{self._word}"? Reply \\boxed{{N}}. You have {self.max_turns}'
        " tries."
    ), {}

  def step(self, action):
    if self._done:
      return "The game is over.", 0.0, True, False, {}
    self.turn_count += 1
    count = _count(action)
    if count == self._word.count(self._letter):
      self._done = True
      return "Correct!", 1.0, True, False, {}
    msg = (
        "Put the count inside \\boxed{}." if count is None else f"Not {count}."
    )
    if self.turn_count >= self.max_turns:
      self._done = True
      return f"{msg} Out of tries.", 0.0, False, True, {}
    return f"{msg} Try again.", 0.0, False, False, {}

  def hint(self):
    return "Spelled out: " + " ".join(self._word) + "."

  def solution(self):
    return [f"\\boxed{{{self._word.count(self._letter)}}}"]

  def close(self):
    pass
