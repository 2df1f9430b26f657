"""Seed environment (deduction): knights always tell the truth, knaves lie."""

import itertools
import random
import re


def _boxed(action):
  found = re.findall(r"\\boxed\{([^{}]*)\}", action)
  return found[-1].strip() if found else None


_NAMES = ["Ada", "Bo", "Cy", "Di", "Ed", "Flo", "Gus", "Hal"]


class KnightsKnavesEnv:
  """Decide who is a knight (always truthful) and who is a knave (always lies).

  Four islanders each make one statement. Name one islander's type per turn;
  a single wrong claim loses the game.
  """

  def __init__(self, max_turns=8, **kwargs):
    self.max_turns = max_turns
    self.reset()

  def _statement(self, rng, speaker, people):
    other = rng.choice([p for p in people if p != speaker])
    third = rng.choice([p for p in people if p not in (speaker, other)])
    kind = rng.randrange(4)
    if kind == 0:
      t = rng.choice(["knight", "knave"])
      return f"{other} is a {t}.", lambda w: w[other] == (t == "knight")
    if kind == 1:
      return (
          f"{other} and {third} are of the same type.",
          lambda w: w[other] == w[third],
      )
    if kind == 2:
      return (
          f"At least one of {other} and {third} is a knave.",
          lambda w: not (w[other] and w[third]),
      )
    return (
        f"Exactly one of {other} and {third} is a knight.",
        lambda w: w[other] != w[third],
    )

  def reset(self, seed=None):
    rng = random.Random(seed)
    while True:
      people = rng.sample(_NAMES, 4)
      said = {p: self._statement(rng, p, people) for p in people}
      worlds = []
      for bits in itertools.product([True, False], repeat=4):
        w = dict(zip(people, bits))
        if all(said[p][1](w) == w[p] for p in people):
          worlds.append(w)
      if len(worlds) == 1:
        break
    self._people = people
    self._said = {p: s for p, (s, _) in said.items()}
    self._truth = worlds[0]
    self._named = set()
    self.turn_count = 0
    self._done = False
    return (
        "Knights and knaves. Knights always tell the truth; knaves always"
        f" lie.\n{self._show()}\nName one islander's type per turn, e.g."
        f" \\boxed{{{people[0]} knight}} or \\boxed{{{people[0]} knave}}. One"
        " wrong claim and you lose; name all four to win."
    ), {}

  def _show(self):
    return "\n".join(f"{p} says: {self._said[p]}" for p in self._people)

  def step(self, action):
    if self._done:
      return "The game is over.", 0.0, True, False, {}
    self.turn_count += 1
    ans = _boxed(action)
    parts = ans.split() if ans else []
    if (
        len(parts) != 2
        or parts[0] not in self._people
        or parts[1].lower() not in ("knight", "knave")
    ):
      msg = "Reply like \\boxed{NAME knight} or \\boxed{NAME knave}."
    elif self._truth[parts[0]] != (parts[1].lower() == "knight"):
      self._done = True
      return f"Wrong: {parts[0]} is not a {parts[1]}.", 0.0, True, False, {}
    else:
      self._named.add(parts[0])
      if len(self._named) == 4:
        self._done = True
        return "All four identified. You win!", 1.0, True, False, {}
      msg = f"Right, {parts[0]} is a {parts[1].lower()}."
    if self.turn_count >= self.max_turns:
      self._done = True
      return f"{msg} Out of turns.", 0.0, False, True, {}
    todo = ", ".join(p for p in self._people if p not in self._named)
    return (
        f"{msg}\n{self._show()}\nStill to name: {todo}.",
        0.0,
        False,
        False,
        {},
    )

  def hint(self):
    p = self._people[0]
    return f"{p} is a {'knight' if self._truth[p] else 'knave'}."

  def solution(self):
    return [
        f"\\boxed{{{p} {'knight' if self._truth[p] else 'knave'}}}"
        for p in self._people
        if p not in self._named
    ]

  def close(self):
    pass
