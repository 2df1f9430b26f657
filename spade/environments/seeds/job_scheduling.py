"""Seed environment (optimisation): balance jobs on two machines."""

import itertools
import random
import re


def _boxed(action):
  found = re.findall(r"\\boxed\{([^{}]*)\}", action)
  return found[-1].strip().upper() if found else None


class JobSchedulingEnv:
  """Assign eight jobs of known durations to machine A or B, one per turn.

  Both machines run in parallel; the finishing time is the busier machine's
  load. Win by achieving the smallest finishing time possible.
  """

  def __init__(self, max_turns=12, **kwargs):
    self.max_turns = max_turns
    self.reset()

  def reset(self, seed=None):
    rng = random.Random(seed)
    self._jobs = [rng.randint(5, 40) for _ in range(8)]
    best, plan = None, None
    for bits in itertools.product("AB", repeat=8):
      a = sum(j for j, m in zip(self._jobs, bits) if m == "A")
      span = max(a, sum(self._jobs) - a)
      if best is None or span < best:
        best, plan = span, bits
    self._best, self._plan = best, plan
    self._loads = {"A": 0, "B": 0}
    self._i = 0
    self.turn_count = 0
    self._done = False
    return (
        f"Scheduling. Job durations in order: {self._jobs}. Assign each job"
        " to machine \\boxed{A} or \\boxed{B}. Win by finishing as early as"
        f" possible.\n{self._show()}"
    ), {}

  def _show(self):
    return (
        f"Job {self._i + 1} (duration {self._jobs[self._i]}). Loads:"
        f" A={self._loads['A']} B={self._loads['B']}."
    )

  def step(self, action):
    if self._done:
      return "The game is over.", 0.0, True, False, {}
    self.turn_count += 1
    m = _boxed(action)
    if m not in ("A", "B"):
      msg = "Reply \\boxed{A} or \\boxed{B}."
    else:
      self._loads[m] += self._jobs[self._i]
      self._i += 1
      msg = f"Job {self._i} went to {m}."
      if self._i == len(self._jobs):
        self._done = True
        span = max(self._loads.values())
        if span == self._best:
          return f"{msg} Finish time {span}: optimal!", 1.0, True, False, {}
        return (
            f"{msg} Finish time {span}; {self._best} was possible.",
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
    return f"The best finishing time is {self._best}."

  def solution(self):
    # Any optimal split consistent with the jobs already placed.
    a_so_far = self._loads["A"]
    rest = self._jobs[self._i :]
    for bits in itertools.product("AB", repeat=len(rest)):
      a = a_so_far + sum(j for j, m in zip(rest, bits) if m == "A")
      if max(a, sum(self._jobs) - a) == self._best:
        return [f"\\boxed{{{m}}}" for m in bits]
    return ["\\boxed{A}"] * len(rest)

  def close(self):
    pass
