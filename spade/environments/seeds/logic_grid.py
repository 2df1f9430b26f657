"""Seed environment (deduction): a small logic-grid puzzle."""

import itertools
import random
import re


def _boxed(action):
  found = re.findall(r"\\boxed\{([^{}]*)\}", action)
  return found[-1].strip() if found else None


_PEOPLE = ["Ann", "Ben", "Cid", "Dot"]
_COLOURS = ["red", "blue", "green", "white"]


class LogicGridEnv:
  """Four people live in houses 1-4, each painted a different colour.

  Clues pin down a unique arrangement. Each turn, state one person's house
  number and colour; two wrong statements lose the game.
  """

  def __init__(self, max_turns=7, **kwargs):
    self.max_turns = max_turns
    self.reset()

  def _clue(self, rng, truth):
    p, q = rng.sample(_PEOPLE, 2)
    kind = rng.randrange(5)
    pos, col = truth
    if kind == 0:
      return f"{p} lives in the {col[p]} house.", lambda s: s[1][p] == col[p]
    if kind == 1:
      rel = "left of" if pos[p] < pos[q] else "right of"
      return (
          f"{p} lives somewhere {rel} {q} (house numbers grow to the right).",
          lambda s: (s[0][p] < s[0][q]) == (pos[p] < pos[q]),
      )
    if kind == 2:
      c = rng.choice([c for c in _COLOURS if c != col[p]])
      return f"{p} does not live in the {c} house.", lambda s: s[1][p] != c
    if kind == 3:
      parity = "an even" if pos[p] % 2 == 0 else "an odd"
      return (
          f"{p} lives in {parity}-numbered house.",
          lambda s: s[0][p] % 2 == pos[p] % 2,
      )
    adj = abs(pos[p] - pos[q]) == 1
    return (
        f"{p} and {q} are {'' if adj else 'not '}next-door neighbours.",
        lambda s: (abs(s[0][p] - s[0][q]) == 1) == adj,
    )

  def reset(self, seed=None):
    rng = random.Random(seed)
    houses = rng.sample([1, 2, 3, 4], 4)
    colours = rng.sample(_COLOURS, 4)
    truth = (dict(zip(_PEOPLE, houses)), dict(zip(_PEOPLE, colours)))
    space = [
        (dict(zip(_PEOPLE, h)), dict(zip(_PEOPLE, c)))
        for h in itertools.permutations([1, 2, 3, 4])
        for c in itertools.permutations(_COLOURS)
    ]
    clues = []
    while len(space) > 1:
      text, test = self._clue(rng, truth)
      kept = [s for s in space if test(s)]
      if len(kept) < len(space):
        clues.append(text)
        space = kept
    self._truth = truth
    self._clues = clues
    self._named = set()
    self._lives = 2
    self.turn_count = 0
    self._done = False
    return (
        "Logic grid. Ann, Ben, Cid and Dot live in houses 1-4 (one each),"
        " painted red, blue, green and white (one colour each).\n"
        f"{self._show()}\nState one person per turn, e.g."
        " \\boxed{Ann 3 green}. Two wrong statements lose."
    ), {}

  def _show(self):
    return "Clues:\n" + "\n".join(f"- {c}" for c in self._clues)

  def step(self, action):
    if self._done:
      return "The game is over.", 0.0, True, False, {}
    self.turn_count += 1
    parts = (_boxed(action) or "").split()
    if len(parts) != 3 or parts[0] not in _PEOPLE or not parts[1].isdigit():
      msg = "Reply like \\boxed{Ann 3 green}."
    elif (
        self._truth[0][parts[0]] == int(parts[1])
        and self._truth[1][parts[0]] == parts[2].lower()
    ):
      self._named.add(parts[0])
      if len(self._named) == 4:
        self._done = True
        return "Everyone placed. You solved it!", 1.0, True, False, {}
      msg = f"Correct for {parts[0]}."
    else:
      self._lives -= 1
      msg = f"That is not right for {parts[0]}."
      if self._lives == 0:
        self._done = True
        return f"{msg} No lives left.", 0.0, True, False, {}
    if self.turn_count >= self.max_turns:
      self._done = True
      return f"{msg} Out of turns.", 0.0, False, True, {}
    return f"{msg} Lives: {self._lives}.\n{self._show()}", 0.0, False, False, {}

  def hint(self):
    p = _PEOPLE[0]
    return f"{p} lives in house {self._truth[0][p]}."

  def solution(self):
    return [
        f"\\boxed{{{p} {self._truth[0][p]} {self._truth[1][p]}}}"
        for p in _PEOPLE
        if p not in self._named
    ]

  def close(self):
    pass
