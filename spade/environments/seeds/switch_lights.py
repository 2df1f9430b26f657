"""Seed environment (causal): find which switch controls which lamp."""

import random
import re


def _boxed(action):
  found = re.findall(r"\\boxed\{([^{}]*)\}", action)
  return " ".join(found[-1].lower().split()) if found else None


class SwitchLightsEnv:
  """Five switches each control one of five lamps, wired in a hidden order.

  Flip switches to watch the lamps change, then declare the wiring: for
  switches 1..5 in order, the lamp letter each controls. Seven turns in
  all; a wrong declaration loses.
  """

  def __init__(self, max_turns=7, **kwargs):
    self.max_turns = max_turns
    self.reset()

  def reset(self, seed=None):
    rng = random.Random(seed)
    self._wiring = rng.sample("abcde", 5)
    self._lamps = {l: rng.random() < 0.5 for l in "abcde"}
    self.turn_count = 0
    self._done = False
    return (
        "Switches. Switches 1-5 each toggle one lamp a-e (a hidden one-to-one"
        f" wiring). Lamps now: {self._show()}. Flip with \\boxed{{flip 3}};"
        " declare with \\boxed{wiring c a e b d} (lamp of switch 1, 2, ...)."
        f" {self.max_turns} turns; a wrong wiring loses."
    ), {}

  def _show(self):
    return " ".join(
        f"{l}={'on' if v else 'off'}" for l, v in self._lamps.items()
    )

  def step(self, action):
    if self._done:
      return "The game is over.", 0.0, True, False, {}
    self.turn_count += 1
    cmd = (_boxed(action) or "").split()
    if len(cmd) == 2 and cmd[0] == "flip" and cmd[1] in "12345" and cmd[1]:
      lamp = self._wiring[int(cmd[1]) - 1]
      self._lamps[lamp] = not self._lamps[lamp]
      msg = f"Flipped switch {cmd[1]}. Lamps: {self._show()}."
    elif len(cmd) == 6 and cmd[0] == "wiring":
      self._done = True
      if cmd[1:] == self._wiring:
        return "The wiring is right!", 1.0, True, False, {}
      return f"Wrong; it was {' '.join(self._wiring)}.", 0.0, True, False, {}
    else:
      msg = "Reply \\boxed{flip N} or \\boxed{wiring a b c d e}."
    if self.turn_count >= self.max_turns:
      self._done = True
      return f"{msg} Out of turns.", 0.0, False, True, {}
    return (
        f"{msg} Turns left: {self.max_turns - self.turn_count}.",
        0.0,
        False,
        False,
        {},
    )

  def hint(self):
    return f"Switch 1 controls lamp {self._wiring[0]}."

  def solution(self):
    # Flipping switches 1-4 reveals their lamps; switch 5 gets the last one.
    return [f"\\boxed{{flip {i}}}" for i in range(1, 5)] + [
        "\\boxed{wiring " + " ".join(self._wiring) + "}"
    ]

  def close(self):
    pass
