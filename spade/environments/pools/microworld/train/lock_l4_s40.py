D = 4
T = "lock osq"


class DigitLockEnv:
 def reset(s, seed=None):
  s.n = D
  return f"Open the {T}: type {D} digits.", {}

 def hint(s):
  s.n = (D + 1) // 2
  return ""

 def step(s, a):
  w = len(a) >= s.n and a[:s.n].isdigit()
  return "Done.", float(w), True, False, {}

 def solution(s):
  return ["7" * D]
