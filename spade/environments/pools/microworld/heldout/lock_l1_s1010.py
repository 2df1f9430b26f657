DIGITS = 1
TAG = "lock vth"


class DigitLockEnv:
  """Reply with DIGITS digits in a row to win."""

  def __init__(self, max_turns=1, **kwargs):
    self.reset()

  def reset(self, seed=None):
    self.need, self.skip = DIGITS, 0
    return f"Open the {TAG}: type {DIGITS} digits.", {}

  def hint(self):
    self.need, self.skip = max(1, DIGITS - 1), int(DIGITS == 1)
    return "One digit is typed for you."

  def step(self, action):
    a = str(action)
    ok = any(a[s:s + self.need].isdigit() and len(a) >= s + self.need
             for s in range(self.skip + 1))
    return "Done.", float(ok), True, False, {}

  def solution(self):
    return ["7" * DIGITS]
