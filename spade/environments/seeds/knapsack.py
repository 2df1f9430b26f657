"""Seed environment (optimisation): decide item by item to fill a knapsack."""

import random
import re


def _boxed(action):
  found = re.findall(r"\\boxed\{([^{}]*)\}", action)
  return found[-1].strip().lower() if found else None


class KnapsackEnv:
  """Eight items (weight, value) are offered one at a time; take or skip.

  The whole list is visible from the start. The knapsack has a weight
  limit; win by ending with the best total value possible.
  """

  def __init__(self, max_turns=12, **kwargs):
    self.max_turns = max_turns
    self.reset()

  def reset(self, seed=None):
    rng = random.Random(seed)
    self._items = [(rng.randint(2, 12), rng.randint(3, 30)) for _ in range(8)]
    self._cap = sum(w for w, _ in self._items) // 2
    self._best, self._pick = self._optimum()
    self._i = 0
    self._weight = 0
    self._value = 0
    self.turn_count = 0
    self._done = False
    listing = "; ".join(
        f"#{k + 1} w={w} v={v}" for k, (w, v) in enumerate(self._items)
    )
    return (
        f"Knapsack. Weight limit {self._cap}. Items in order: {listing}."
        " For each item in turn reply \\boxed{take} or \\boxed{skip}. Win by"
        f" reaching the best possible value.\n{self._show()}"
    ), {}

  def _optimum(self):
    best = {0: (0, ())}
    for k, (w, v) in enumerate(self._items):
      nxt = dict(best)
      for used, (val, picks) in best.items():
        u = used + w
        if u <= self._cap and (u not in nxt or nxt[u][0] < val + v):
          nxt[u] = (val + v, picks + (k,))
      best = nxt
    return max(best.values())

  def _show(self):
    if self._i >= len(self._items):
      return ""
    w, v = self._items[self._i]
    return (
        f"Item #{self._i + 1}: w={w} v={v}. Load {self._weight}/{self._cap},"
        f" value {self._value}."
    )

  def step(self, action):
    if self._done:
      return "The game is over.", 0.0, True, False, {}
    self.turn_count += 1
    ans = _boxed(action)
    if ans not in ("take", "skip"):
      msg = "Reply \\boxed{take} or \\boxed{skip}."
    else:
      w, v = self._items[self._i]
      if ans == "take" and self._weight + w > self._cap:
        msg = "Too heavy; item skipped."
      elif ans == "take":
        self._weight += w
        self._value += v
        msg = f"Took item #{self._i + 1}."
      else:
        msg = f"Skipped item #{self._i + 1}."
      self._i += 1
      if self._i == len(self._items):
        self._done = True
        if self._value == self._best:
          return f"{msg} Value {self._value}: optimal!", 1.0, True, False, {}
        return (
            f"{msg} Value {self._value}; the best was {self._best}.",
            0.0,
            True,
            False,
            {},
        )
    if self.turn_count >= self.max_turns:
      self._done = True
      return f"{msg} Out of turns.", 0.0, False, True, {}
    return f"{msg}\n{self._show()}", 0.0, False, False, {}

  def hint(self):
    return f"The best total value is {self._best}."

  def solution(self):
    return [
        "\\boxed{take}" if k in self._pick else "\\boxed{skip}"
        for k in range(self._i, len(self._items))
    ]

  def close(self):
    pass
