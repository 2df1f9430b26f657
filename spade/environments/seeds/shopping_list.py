"""Seed environment (memory): buy exactly a list shown only at the start."""

import random
import re


def _boxed(action):
  found = re.findall(r"\\boxed\{([^{}]*)\}", action)
  return " ".join(found[-1].lower().split()) if found else None


_GOODS = [
    "apples",
    "bread",
    "cheese",
    "eggs",
    "flour",
    "grapes",
    "honey",
    "jam",
    "lemons",
    "milk",
    "nuts",
    "olives",
    "pears",
    "rice",
    "salt",
    "tea",
]


class ShoppingListEnv:
  """A shopping list is shown once; then the shop opens without it.

  Buy each listed item in its exact quantity (one purchase per turn), then
  check out. The cart must match the list exactly; there is one spare turn.
  """

  def __init__(self, max_turns=10, **kwargs):
    self.max_turns = max_turns
    self.reset()

  def reset(self, seed=None):
    rng = random.Random(seed)
    items = rng.sample(_GOODS, 5)
    self._list = {g: rng.randint(1, 4) for g in items}
    self._cart = {}
    self._open = False
    self.turn_count = 0
    self._done = False
    wanted = ", ".join(f"{n} {g}" for g, n in self._list.items())
    return (
        f"Shopping. Memorise this list: {wanted}. It will not be shown again."
        " Reply \\boxed{ready} to enter the shop."
    ), {}

  def step(self, action):
    if self._done:
      return "The game is over.", 0.0, True, False, {}
    self.turn_count += 1
    cmd = (_boxed(action) or "").split()
    if not self._open:
      self._open = True
      msg = "You are in the shop."
    elif (
        len(cmd) == 3
        and cmd[0] == "buy"
        and cmd[1].isdigit()
        and cmd[2] in _GOODS
    ):
      self._cart[cmd[2]] = self._cart.get(cmd[2], 0) + int(cmd[1])
      msg = f"Added {cmd[1]} {cmd[2]}."
    elif cmd == ["checkout"]:
      self._done = True
      if self._cart == self._list:
        return "The cart matches the list. Well done!", 1.0, True, False, {}
      return "The cart does not match the list.", 0.0, True, False, {}
    else:
      msg = "Reply \\boxed{buy 2 milk} or \\boxed{checkout}."
    if self.turn_count >= self.max_turns:
      self._done = True
      return f"{msg} The shop closed.", 0.0, False, True, {}
    return (
        f"{msg} Goods: {', '.join(_GOODS)}. Buy with \\boxed{{buy 2 milk}},"
        f" finish with \\boxed{{checkout}}. Cart: {len(self._cart)} kinds."
        f" Turns left: {self.max_turns - self.turn_count}.",
        0.0,
        False,
        False,
        {},
    )

  def hint(self):
    g = sorted(self._list)[0]
    return f"The list includes {self._list[g]} {g}."

  def solution(self):
    plan = [] if self._open else ["\\boxed{ready}"]
    plan += [f"\\boxed{{buy {n} {g}}}" for g, n in self._list.items()]
    return plan + ["\\boxed{checkout}"]

  def close(self):
    pass
