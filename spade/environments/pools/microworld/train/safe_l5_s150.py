D = 5
T = "safe kmg"


class DigitLockEnv:
 def reset(s, seed=None):
  s.n, s.o = D, 0
  return f"Open the {T}: type {D} digits.", {}

 def hint(s):
  s.n, s.o = max(1, D - 1), int(D < 2)
  return ""

 def step(s, a):
  w = any(a[i:i + s.n].isdigit() and len(a) >= i + s.n for i in range(s.o + 1))
  return "Done.", float(w), True, False, {}

 def solution(s):
  return ["7" * D]
