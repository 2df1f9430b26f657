"""Seed environment (causal): find which two factors make a plant grow."""

import itertools
import random
import re


def _boxed(action):
  found = re.findall(r"\\boxed\{([^{}]*)\}", action)
  return " ".join(found[-1].lower().split()) if found else None


_FACTORS = ["light", "water", "warmth", "music"]
_RULES = {
    "and": lambda x, y: x and y,
    "or": lambda x, y: x or y,
    "xor": lambda x, y: x != y,
}


def _imbalance(cfg, cands):
  yes = sum(_RULES[r](cfg[p[0]], cfg[p[1]]) for p, r in cands)
  return abs(2 * yes - len(cands))


class PlantGrowthEnv:
  """A plant grows or not depending on two of four factors and one rule.

  Run experiments (set each factor on or off, see whether the plant grows),
  then name the two factors and the rule (and, or, xor). Eight turns; a
  wrong answer loses.
  """

  def __init__(self, max_turns=8, **kwargs):
    self.max_turns = max_turns
    self.reset()

  def reset(self, seed=None):
    rng = random.Random(seed)
    self._pair = sorted(rng.sample(range(4), 2))
    self._rule = rng.choice(sorted(_RULES))
    self._log = []
    self.turn_count = 0
    self._done = False
    return (
        "Plant lab. Growth depends on exactly two of light, water, warmth,"
        " music through a rule: and, or, or xor. Experiment with"
        " \\boxed{test 1 0 1 1} (light water warmth music on/off). Answer"
        " with \\boxed{answer water music xor}. 8 turns; a wrong answer"
        " loses."
    ), {}

  def _grows(self, bits):
    a, b = (bits[i] for i in self._pair)
    return _RULES[self._rule](a, b)

  def step(self, action):
    if self._done:
      return "The game is over.", 0.0, True, False, {}
    self.turn_count += 1
    cmd = (_boxed(action) or "").split()
    if (
        len(cmd) == 5
        and cmd[0] == "test"
        and all(c in "01" and c for c in cmd[1:])
    ):
      bits = [c == "1" for c in cmd[1:]]
      grows = self._grows(bits)
      self._log.append(f"{' '.join(cmd[1:])} -> {'grows' if grows else 'no'}")
      msg = f"The plant {'grows' if grows else 'does not grow'}."
    elif len(cmd) == 4 and cmd[0] == "answer":
      self._done = True
      want = sorted(_FACTORS[i] for i in self._pair)
      if sorted(cmd[1:3]) == want and cmd[3] == self._rule:
        return "Correct causal rule!", 1.0, True, False, {}
      return (
          f"Wrong: it was {want[0]} {self._rule} {want[1]}.",
          0.0,
          True,
          False,
          {},
      )
    else:
      msg = "Reply \\boxed{test a b c d} or \\boxed{answer F1 F2 RULE}."
    if self.turn_count >= self.max_turns:
      self._done = True
      return f"{msg} Out of turns.", 0.0, False, True, {}
    return (
        f"{msg} Results: {'; '.join(self._log)}. Turns left:"
        f" {self.max_turns - self.turn_count}.",
        0.0,
        False,
        False,
        {},
    )

  def hint(self):
    return f"One of the two factors is {_FACTORS[self._pair[0]]}."

  def solution(self):
    # Experiments that tell every (pair, rule) apart, chosen by simulation.
    tests = []
    cands = [
        (p, r) for p in itertools.combinations(range(4), 2) for r in _RULES
    ]
    configs = list(itertools.product([False, True], repeat=4))
    while len(cands) > 1:
      cfg = min(configs, key=lambda c: _imbalance(c, cands))
      res = _RULES[self._rule](cfg[self._pair[0]], cfg[self._pair[1]])
      cands = [
          (p, r) for p, r in cands if _RULES[r](cfg[p[0]], cfg[p[1]]) == res
      ]
      tests.append("\\boxed{test " + " ".join(str(int(b)) for b in cfg) + "}")
    (i, j), rule = cands[0]
    return tests + [f"\\boxed{{answer {_FACTORS[i]} {_FACTORS[j]} {rule}}}"]

  def close(self):
    pass
