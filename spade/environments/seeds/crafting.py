"""Seed environment (planning): gather and craft toward a target item."""

import random
import re


def _boxed(action):
  found = re.findall(r"\\boxed\{([^{}]*)\}", action)
  return " ".join(found[-1].lower().split()) if found else None


_RAW = ["wood", "stone", "iron", "clay", "wool"]
_MADE = ["plank", "brick", "nail", "rope", "frame", "wall", "cart", "tower"]


class CraftingEnv:
  """Craft a target item from raw materials through intermediate recipes.

  Each turn either gathers one unit of a raw material or crafts one item
  from its ingredients. Some recipes are decoys. Turns are tight: only one
  spare turn beyond the shortest plan.
  """

  def __init__(self, max_turns=30, **kwargs):
    self.max_turns = max_turns
    self.reset()

  def reset(self, seed=None):
    rng = random.Random(seed)
    made = rng.sample(_MADE, 6)
    recipes = {}
    # Two tiers: four parts from raw materials, then two items from parts.
    for item in made[:4]:
      recipes[item] = {r: rng.randint(1, 2) for r in rng.sample(_RAW, 2)}
    for item in made[4:]:
      parts = rng.sample(made[:4], 2)
      recipes[item] = {p: 1 for p in parts}
      recipes[item][rng.choice(_RAW)] = 1
    self._recipes = recipes
    self._target = made[5]
    self._inv = {}
    self._plan = self._plan_for(self._target, [])
    self._budget = len(self._plan) + 1
    self._used = 0
    self.turn_count = 0
    self._done = False
    return (
        f"Crafting. Make one {self._target}.\nRecipes:\n{self._show_recipes()}"
        "\nEach turn \\boxed{gather wood} (one unit of a raw material:"
        f" {', '.join(_RAW)}) or \\boxed{{craft {made[0]}}}. You have"
        f" {self._budget} turns."
    ), {}

  def _show_recipes(self):
    return "\n".join(
        f"{item} = " + " + ".join(f"{n} {i}" for i, n in need.items())
        for item, need in sorted(self._recipes.items())
    )

  def _plan_for(self, item, plan):
    for ing, n in self._recipes[item].items():
      for _ in range(n):
        if ing in self._recipes:
          self._plan_for(ing, plan)
        else:
          plan.append(f"gather {ing}")
    plan.append(f"craft {item}")
    return plan

  def step(self, action):
    if self._done:
      return "The game is over.", 0.0, True, False, {}
    self.turn_count += 1
    cmd = (_boxed(action) or "").split()
    msg = "Reply \\boxed{gather MATERIAL} or \\boxed{craft ITEM}."
    if len(cmd) == 2 and cmd[0] in ("gather", "craft"):
      self._used += 1
      if cmd[0] == "gather" and cmd[1] in _RAW:
        self._inv[cmd[1]] = self._inv.get(cmd[1], 0) + 1
        msg = f"Gathered 1 {cmd[1]}."
      elif cmd[0] == "craft" and cmd[1] in self._recipes:
        need = self._recipes[cmd[1]]
        if all(self._inv.get(i, 0) >= n for i, n in need.items()):
          for i, n in need.items():
            self._inv[i] -= n
          self._inv[cmd[1]] = self._inv.get(cmd[1], 0) + 1
          msg = f"Crafted a {cmd[1]}."
        else:
          msg = f"Missing ingredients for {cmd[1]}."
      else:
        msg = f"Cannot {cmd[0]} {cmd[1]}."
      if self._inv.get(self._target, 0):
        self._done = True
        return f"{msg} You made the {self._target}!", 1.0, True, False, {}
      if self._used >= self._budget:
        self._done = True
        return f"{msg} Out of time.", 0.0, True, False, {}
    if self.turn_count >= self.max_turns:
      self._done = True
      return f"{msg} Out of turns.", 0.0, False, True, {}
    inv = ", ".join(f"{k}:{v}" for k, v in sorted(self._inv.items()) if v)
    return (
        f"{msg} Inventory: {inv or 'empty'}. Turns left:"
        f" {self._budget - self._used}.",
        0.0,
        False,
        False,
        {},
    )

  def hint(self):
    return f"The {self._target} needs: {self._recipes[self._target]}."

  def solution(self):
    return [f"\\boxed{{{a}}}" for a in self._plan]

  def close(self):
    pass
