L = 5
S = "dacbdcabdbcadcab"


class LadderEnv:
 def reset(s, seed=None):
  s.n = L
  return f"Say the first {L} letters of the code.", {}

 def hint(s):
  s.n = L - 1
  return ""

 def step(s, a):
  return "Done.", float(a[:s.n] == S[:s.n]), True, False, {}

 def solution(s):
  return [S[:L]]
