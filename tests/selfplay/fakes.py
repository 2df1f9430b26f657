"""A fake policy and environment executor for the loop's host-logic tests.

No model and no sandbox: `FakeEngine` answers what `loop.iteration` and the
design phase ask of the policy (render, prompt budget, sample, update) and of
the executor (validate).
"""

import types

from spade.designer import templates
from spade.selfplay import records

PROGRAM = '''
class CountEnv:
    """Count to three."""

    def __init__(self, max_turns=3):
        self.n = 0

    def reset(self, seed=None):
        self.n = 0
        return "count", {}

    def step(self, action):
        self.n += 1
        return "ok", float(self.n == 3), self.n == 3, False, {}
'''

HINT = "Count to three, one step at a time."

_BOS = 257
_HINT_SYSTEMS = (templates.HINT_SYSTEM, templates.TOOL_USE_HINT_SYSTEM)
# The end of a rendered hint request, which `design.fit` keeps when it cuts
# a prompt to the budget.
_TAIL = 32


class FakeEngine:
  """What the loop asks of the policy and the environment executor.

  Every sampled row counts: its completion ids are [1, 2, n] for the n-th
  row sampled in the run. A hint request (a prompt rendered from
  `design_prompts.hint_messages`) is answered with `HINT`; every other
  request with a program, `PROGRAM` made distinct by its row count and seed.
  Program j (in validation order) is valid where `valid[j]` says (True past
  its end).
  """

  def __init__(self, config=None, valid=()):
    self.config = config
    self.tokenizer = types.SimpleNamespace(bos_id=_BOS)
    self.valid = list(valid)
    self.rows = 0
    self.sampled = []  # (role, rows) per sampling call
    self.updates = []  # (agent rows, designer rows) per update
    self._hint_tails = set()

  def render(self, messages):
    ids = [_BOS] + [
        ord(c) % 256 for c in "".join(m["content"] for m in messages)
    ]
    if messages[0]["content"] in _HINT_SYSTEMS:
      self._hint_tails.add(tuple(ids[-_TAIL:]))
    return ids

  def prompt_budget(self, role):
    del role
    return 10_000

  def prefill_counts(self):
    return 0, 0, 0

  def sample(
      self,
      prompts,
      *,
      role,
      max_new_tokens,
      temperature,
      seed,
      top_k=0,
      top_p=1.0,
      progress=None,
  ):
    del progress, top_k, top_p
    del max_new_tokens, temperature
    self.sampled.append((role, len(prompts)))
    out = []
    for prompt in prompts:
      self.rows += 1
      if tuple(prompt[-_TAIL:]) in self._hint_tails:
        text = HINT
      else:
        code = PROGRAM.replace("three", f"three ({self.rows}, {seed})")
        text = f"```python\n{code}\n```"
      out.append(([1, 2, self.rows], [-0.5] * 3, text))
    return out

  def validate(self, codes):
    out = []
    for _ in codes:
      ok = self.valid.pop(0) if self.valid else True
      out.append(records.Verdict(ok, "ok" if ok else "smoke"))
    return out

  def update(self, agent_rows, designer_rows, samples=0):
    self.updates.append((list(agent_rows), list(designer_rows)))
    self.samples = samples
    return {"train/loss": 0.0}
