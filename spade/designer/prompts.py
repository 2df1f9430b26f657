"""Prompts for the designer role: environment programs and hints.

The designer sees a grounding document, a few archived environments (the
memory's examples, with their regret and win rates) and the contract, and
writes one complete program. The contract text mirrors
`spade/environments/contract.py` in the short form a model can follow; the
interactive-spec wording follows the reference implementation's
corpus-grounded template.
"""

from __future__ import annotations

from typing import Any, Sequence

DESIGNER_SYSTEM = (
    "You are an expert Python programmer and environment designer. You write"
    " complete, executable, multi-turn training environments for language"
    " model agents."
)

CONTRACT_SPEC = r"""Write ONE Python file defining a class whose name ends in `Env`:
- a class docstring: one paragraph saying what the environment is;
- __init__(self, max_turns=10, **kwargs): initialise every attribute;
- reset(self, seed=None) -> (observation: str, info: dict): random state from
  `random.Random(seed)` so the same seed gives the same episode;
- step(self, action: str) -> (observation, reward, terminated, truncated, info):
  the agent's move is inside \boxed{...}; extract it with
  re.search(r'\\boxed\{(.+?)\}', action); never crash on a bad move;
  rewards in [-1, 1]; a win returns reward 1.0 with terminated=True;
- hint(self) -> str: a privileged hint for the current episode (the approach,
  not the answer);
- solution(self) -> list[str]: actions that win the current episode.
The goal must need several turns (hidden state revealed by acting). Use only
the standard library (numpy and math_verify are also available).
Reply with the code in one ```python block."""

HINT_SYSTEM = (
    "You read an environment's source code and write a short hint for a"
    " player who sees only the observations. Give the key insight and the"
    " answer format in 1-3 sentences; do not reveal the exact answer. Output"
    " only the hint."
)


def _example_block(example: Any) -> str:
  """Formats one archived environment (a memory entry) for the prompt."""
  stats = getattr(example, "stats", None) or {}
  regret = stats.get("regret")
  win = stats.get("win_rate_nohint")
  verdict = getattr(example, "verdict", None) or {}
  head = f"# regret={regret!r} win_rate_without_hint={win!r}"
  if not verdict.get("valid", True):
    head = f"# REJECTED ({verdict.get('reason')}): {verdict.get('message', '')}"
    head = head[:300]
  code = getattr(example, "code", str(example))
  return f"{head}\n```python\n{code[:2000]}\n```"


def designer_messages(
    document: Any | None,
    examples: Sequence[Any] = (),
    parent: Any | None = None,
) -> list[dict[str, str]]:
  """Chat messages asking for one environment program.

  Args:
    document: a grounding document (`.text`, `.title`) or None when grounding
      is off.
    examples: archived environments to show (memory entries: `.code`,
      `.stats`, `.verdict`); high-regret ones as models to beat, a rejected one
      as a mistake to avoid.
    parent: when set, an archived environment to edit into a harder variant
      (mutation).

  Returns:
    [{"role": "system", ...}, {"role": "user", ...}]
  """
  parts = []
  if document is not None:
    parts.append(
        "Create an interactive, multi-turn environment grounded in a concept"
        " from this document (do not mention the document in the game):\n"
        f"<REFERENCE_DOCUMENT title={getattr(document, 'title', '')!r}>\n"
        f"{document.text}\n</REFERENCE_DOCUMENT>"
    )
  else:
    parts.append("Create a new interactive, multi-turn environment.")
  if examples:
    parts.append(
        "Environments made before (make something different; aim where the"
        " player succeeds only with the hint):\n"
        + "\n\n".join(_example_block(e) for e in examples)
    )
  if parent is not None:
    parts.append(
        "Edit this environment into a harder variant of the same idea:\n"
        + _example_block(parent)
    )
  parts.append(CONTRACT_SPEC)
  return [
      {"role": "system", "content": DESIGNER_SYSTEM},
      {"role": "user", "content": "\n\n".join(parts)},
  ]


def hint_messages(code: str) -> list[dict[str, str]]:
  """Chat messages asking the model for a hint from an environment's code."""
  return [
      {"role": "system", "content": HINT_SYSTEM},
      {
          "role": "user",
          "content": f"Environment code:\n```python\n{code[:6000]}\n```",
      },
  ]
