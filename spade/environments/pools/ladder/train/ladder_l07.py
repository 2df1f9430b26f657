L = 7
S = "dacbdcabdbcadcab"


class LadderEnv:
 def reset(s, seed=None):
  s.n = L
  return f"Say {L} letters.", {}

 def hint(s):
  s.n = L - 1
  return ""

 def step(s, a):
  return "", float(a[:s.n] == S[:s.n]), True, False, {}
