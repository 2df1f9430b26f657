"""Levelled families: environments whose programs come at integer levels.

A family names its environments (`names`) and writes, for one of them at a
level and a seed, the source of an environment program in the contract's
format (`spade.environments.contract`: a class ending in `Env` with
`reset`/`step`) whose final reward is binary. The loop's
`train.mode="adaptive"` plays such a family with one
`spade.environments.difficulty.SlidingWindow` window per environment
(`spade.selfplay.adaptive`); RLVE (`spade.environments.rlve`, family "rlve")
is one, a curriculum over hand-written environments can be another.

Families are registered by name. `get` imports the module of a built-in
family on first use, so that importing this module stays cheap (RLVE's
generator needs torch and networkx on the host).
"""

from __future__ import annotations

import importlib
from typing import Protocol, Sequence, runtime_checkable


class GenerationError(RuntimeError):
  """A family could not write this (name, level, seed): the loop leaves the
  environment out for the iteration and says why."""


@runtime_checkable
class Family(Protocol):
  """Environments with levels; `program` writes one at a level."""

  names: Sequence[str]

  def program(self, name: str, level: int, seed: int) -> str:
    """The source of environment `name` at `level`, fixed by `seed`;
    raises `GenerationError` when this problem cannot be made."""
    ...


_REGISTRY: dict[str, Family] = {}

# Built-in families: name -> the module whose import registers it.
_MODULES = {"rlve": "spade.environments.rlve"}


def register(name: str, family: Family) -> None:
  """Makes `family` available as `get(name)` (a later call replaces it)."""
  if not isinstance(family, Family):
    raise TypeError(
        f"family {name!r} must have `names` and `program(name, level, seed)`;"
        f" got {type(family).__name__}"
    )
  _REGISTRY[name] = family


def get(name: str) -> Family:
  """The family registered as `name` (importing a built-in one first)."""
  if name not in _REGISTRY and name in _MODULES:
    importlib.import_module(_MODULES[name])
  if name not in _REGISTRY:
    raise KeyError(
        f"no levelled family {name!r}; registered: {sorted(_REGISTRY)},"
        f" built in: {sorted(_MODULES)} (register one with"
        " spade.environments.levels.register)"
    )
  return _REGISTRY[name]


def names() -> list[str]:
  """Every family name `get` can return."""
  return sorted(set(_REGISTRY) | set(_MODULES))
