"""`train.mode`: what each mode of the loop does, registered by name.

  spade       the designer regenerates the pool every
              `designer.regeneration_interval` iterations; the agent plays
              it with the hint at regeneration and without every iteration.
  fixed_pool  the baseline: no designer; the agent plays programs drawn from
              `train.pool_dir` (or the seed library), with and without the
              hint, a new pool every iteration.
  adaptive    a levelled family (`train.family`) at each environment's
              sliding-window level, unhinted (`spade.selfplay.adaptive`).

`spade.config` reads the allowed names from `names()`; a new mode is one
`Mode` and one `register` call. The loop (`spade.selfplay`) reads a mode's
fields. It lives here, under the config key's section and beside nothing
it imports, so that the config reads it without importing the loop.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Mode:
  """What a mode does.

  Attributes:
    designs: the designer samples the pool (and its window spans
      `designer.regeneration_interval` iterations; else one).
    hinted: the agent plays a hinted arm at regeneration.
    pool: the pool is drawn from the fixed pool.
    levelled: the pool is a levelled family at adaptive levels.
  """

  designs: bool = False
  hinted: bool = True
  pool: bool = False
  levelled: bool = False


_MODES: dict[str, Mode] = {}


def register(name: str, mode: Mode) -> None:
  """Registers `mode` as `train.mode=name`."""
  if name in _MODES:
    raise ValueError(f"train.mode {name!r} is already registered")
  _MODES[name] = mode


def names() -> tuple[str, ...]:
  """The registered modes (`config.train.mode`)."""
  return tuple(_MODES)


def get(config) -> Mode:
  """The mode `config.train.mode` names."""
  name = config.train.mode
  if name not in _MODES:
    raise ValueError(f"unknown train.mode {name!r}; one of {names()}")
  return _MODES[name]


def window_length(config) -> int:
  """Iterations a pool is played: `designer.regeneration_interval` when
  the designer makes it, else 1."""
  if get(config).designs:
    return max(1, config.designer.regeneration_interval)
  return 1


register("spade", Mode(designs=True))
register("fixed_pool", Mode(pool=True))
register("adaptive", Mode(hinted=False, levelled=True))
