"""Seed environment (language): change one letter at a time to reach a word."""

import collections
import random
import re


def _boxed(action):
  found = re.findall(r"\\boxed\{([^{}]*)\}", action)
  return found[-1].strip().lower() if found else None


_WORDS = (
    "cold cord card ward warm word worm form farm harm hard herd here hire"
    " fire fine line lime time tile tale tall tell bell belt bolt boat coat"
    " cost cast case cave gave game gate late lane cane cone bone bond band"
    " land sand said sail mail main rain gain pain pail pall ball bald bold"
    " gold hold hole pole pale male mile mine dine dire dare care core more"
    " mode made fade face fact pact pace race rice nice mice"
).split()


def _near(a, b):
  return sum(x != y for x, y in zip(a, b)) == 1


class WordLadderEnv:
  """Turn a start word into a target word, changing one letter per step.

  Every intermediate word must be in the given word list. The step budget
  is two more than the shortest ladder.
  """

  def __init__(self, max_turns=14, **kwargs):
    self.max_turns = max_turns
    self.reset()

  def _ladder(self, start):
    prev = {start: None}
    queue = collections.deque([start])
    while queue:
      w = queue.popleft()
      if w == self._target:
        path = []
        while prev[w] is not None:
          path.append(w)
          w = prev[w]
        return path[::-1]
      for n in _WORDS:
        if n not in prev and _near(w, n):
          prev[n] = w
          queue.append(n)
    return None

  def reset(self, seed=None):
    rng = random.Random(seed)
    while True:
      start, self._target = rng.sample(_WORDS, 2)
      path = self._ladder(start)
      if path and 4 <= len(path) <= 8:
        break
    self._word = start
    self._budget = len(path) + 2
    self._used = 0
    self.turn_count = 0
    self._done = False
    return (
        f"Word ladder. Go from '{start}' to '{self._target}' changing one"
        " letter per step, e.g. \\boxed{cord}. Allowed words: "
        f"{' '.join(_WORDS)}.\nYou have {self._budget} steps."
    ), {}

  def step(self, action):
    if self._done:
      return "The game is over.", 0.0, True, False, {}
    self.turn_count += 1
    w = _boxed(action)
    if w is None:
      msg = "Reply with one word inside \\boxed{}."
    else:
      self._used += 1
      if w in _WORDS and _near(self._word, w):
        self._word = w
        if w == self._target:
          self._done = True
          return f"'{w}': you reached the target!", 1.0, True, False, {}
        msg = f"Now at '{w}'."
      else:
        msg = f"'{w}' is not an allowed one-letter change of '{self._word}'."
      if self._used >= self._budget:
        self._done = True
        return f"{msg} No steps left.", 0.0, True, False, {}
    if self.turn_count >= self.max_turns:
      self._done = True
      return f"{msg} Out of turns.", 0.0, False, True, {}
    return (
        f"{msg} Target '{self._target}'. Steps left:"
        f" {self._budget - self._used}.",
        0.0,
        False,
        False,
        {},
    )

  def hint(self):
    nxt = self._ladder(self._word)[0]
    return f"The next word on a shortest ladder is '{nxt}'."

  def solution(self):
    return [f"\\boxed{{{w}}}" for w in self._ladder(self._word)]

  def close(self):
    pass
