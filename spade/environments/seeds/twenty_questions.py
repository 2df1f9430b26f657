"""Seed environment (deduction): identify a creature with yes/no questions."""

import random
import re


def _boxed(action):
  found = re.findall(r"\\boxed\{([^{}]*)\}", action)
  return found[-1].strip().lower() if found else None


_TRAITS = ["flies", "swims", "furry", "large"]
_CREATURES = [
    "zorb",
    "quill",
    "mallow",
    "tink",
    "brack",
    "snoot",
    "fennel",
    "glim",
    "hask",
    "jorp",
    "kelm",
    "lurk",
    "nibb",
    "plov",
    "rusk",
    "veem",
]


class TwentyQuestionsEnv:
  """Sixteen made-up creatures differ in four yes/no traits; one is chosen.

  Ask about traits (each answer is truthful), then guess the creature. Six
  turns in all; a wrong guess ends the game.
  """

  def __init__(self, max_turns=6, **kwargs):
    self.max_turns = max_turns
    self.reset()

  def reset(self, seed=None):
    rng = random.Random(seed)
    codes = list(range(16))
    rng.shuffle(codes)
    self._traits = {
        name: {t: bool(code >> i & 1) for i, t in enumerate(_TRAITS)}
        for name, code in zip(_CREATURES, codes)
    }
    self._secret = rng.choice(_CREATURES)
    self._asked = []
    self.turn_count = 0
    self._done = False
    table = "\n".join(
        f"{n}: " + ", ".join(t if v else f"not {t}" for t, v in tr.items())
        for n, tr in self._traits.items()
    )
    self._table = table
    return (
        f"Twenty questions. The creatures:\n{table}\nOne is secret. Ask"
        " \\boxed{ask flies} (traits: flies, swims, furry, large) or guess"
        f" \\boxed{{guess zorb}}. {self.max_turns} turns; a wrong guess loses."
    ), {}

  def step(self, action):
    if self._done:
      return "The game is over.", 0.0, True, False, {}
    self.turn_count += 1
    cmd = (_boxed(action) or "").split()
    if len(cmd) == 2 and cmd[0] == "ask" and cmd[1] in _TRAITS:
      yes = self._traits[self._secret][cmd[1]]
      self._asked.append(f"{cmd[1]}: {'yes' if yes else 'no'}")
      msg = f"Is it {cmd[1]}? {'Yes' if yes else 'No'}."
    elif len(cmd) == 2 and cmd[0] == "guess":
      self._done = True
      if cmd[1] == self._secret:
        return f"Yes, it is the {self._secret}!", 1.0, True, False, {}
      return f"No, it was the {self._secret}.", 0.0, True, False, {}
    else:
      msg = "Reply \\boxed{ask TRAIT} or \\boxed{guess NAME}."
    if self.turn_count >= self.max_turns:
      self._done = True
      return f"{msg} Out of turns.", 0.0, False, True, {}
    return (
        f"{msg} Answers so far: {'; '.join(self._asked)}."
        f" {self.max_turns - self.turn_count} turns left.",
        0.0,
        False,
        False,
        {},
    )

  def hint(self):
    flies = self._traits[self._secret]["flies"]
    return f"The secret creature {'flies' if flies else 'does not fly'}."

  def solution(self):
    return [f"\\boxed{{ask {t}}}" for t in _TRAITS] + [
        f"\\boxed{{guess {self._secret}}}"
    ]

  def close(self):
    pass
