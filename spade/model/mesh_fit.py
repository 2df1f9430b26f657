"""Whether a mesh's axes divide an array's dimensions.

Every layout that may meet a width its mesh axes do not divide (a
parameter's sharding, the decoding layout's kernels, the KV cache's heads)
keeps that dimension whole instead; this is the one check they share.
Also the one lookup of a logical axis's mesh axes under the trace's rules.
"""

from __future__ import annotations

import flax.linen as nn
import numpy as np


def mesh_axes(name: str):
  """The mesh axes the trace's rules give logical axis `name` (a name, a
  tuple of them, or None)."""
  return nn.logical_to_mesh_axes((name,), nn.get_logical_axis_rules())[0]


def axis_names(entry) -> tuple[str, ...]:
  """One `PartitionSpec` entry (None, a mesh axis or a sequence of them) as
  a tuple of mesh axis names (None: none)."""
  if entry is None:
    return ()
  return (entry,) if isinstance(entry, str) else tuple(entry)


def split_ways(mesh, entry) -> int:
  """How many pieces one `PartitionSpec` entry (None, a mesh axis or a
  tuple of them) cuts a dimension into on `mesh`."""
  return int(np.prod([mesh.shape[n] for n in axis_names(entry)]))


def divides(mesh, shape, spec) -> list[bool]:
  """For each dimension of `shape`, whether its `spec` entry (a
  `PartitionSpec`'s, missing entries None) splits it evenly on `mesh`."""
  spec = list(spec) + [None] * (len(shape) - len(spec))
  return [size % split_ways(mesh, e) == 0 for size, e in zip(shape, spec)]
