"""Whether a mesh's axes divide an array's dimensions.

Every layout that may meet a width its mesh axes do not divide (a
parameter's sharding, the decoding layout's kernels, the KV cache's heads)
keeps that dimension whole instead; this is the one check they share.
"""

from __future__ import annotations

import numpy as np


def split_ways(mesh, entry) -> int:
  """How many pieces one `PartitionSpec` entry (None, a mesh axis or a
  tuple of them) cuts a dimension into on `mesh`."""
  if entry is None:
    return 1
  names = entry if isinstance(entry, tuple) else (entry,)
  return int(np.prod([mesh.shape[n] for n in names]))


def divides(mesh, shape, spec) -> list[bool]:
  """For each dimension of `shape`, whether its `spec` entry (a
  `PartitionSpec`'s, missing entries None) splits it evenly on `mesh`."""
  spec = list(spec) + [None] * (len(shape) - len(spec))
  return [size % split_ways(mesh, e) == 0 for size, e in zip(shape, spec)]
