"""Cloud TPU slice names (v5p-32, v5e-16, v6e-8, ...) and what they hold.

One table serves the launcher (`launch/xm_launch.py`: hosts, chips per host,
the XManager resource and GKE labels) and the ahead-of-time compiler
(`spade.compile`: the device list of the slice from
`jax.experimental.topologies.get_topology_desc`, each chip's HBM and peak
bfloat16 FLOP/s), so a config that compiles for `--topology=v5p-32` is the
config that launches with `--tpu=v5p-32`.

Naming rules (Cloud TPU "supported configurations" pages):

  v4-N, v5p-N   N counts TensorCores, 2 per chip: chips = N/2; every host
                (TPU VM) has 4 chips: hosts = chips/4. v5p-32 = 16 chips on
                4 hosts, topology 2x2x4. JAX sees one device per chip
                (megacore).
  v5e-N, v6e-N  N counts chips (v5e is also written v5litepod-N). Slices of
                1, 4 or 8 chips are one VM; larger ones are made of 4-chip
                hosts: hosts = N/4. v6e-16 = 16 chips on 4 hosts, topology
                4x4.

This module imports nothing beyond the standard library at import time (the
launcher runs where JAX may be absent); `devices` imports JAX when called.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

# Default slice shapes (AcceleratorConfig topologies) by chip count, from the
# Cloud TPU configuration tables. Other shapes: pass an explicit topology.
TOPOLOGY_3D = {
    4: "2x2x1",
    8: "2x2x2",
    16: "2x2x4",
    32: "2x4x4",
    64: "4x4x4",
    128: "4x4x8",
    256: "4x8x8",
    512: "8x8x8",
    1024: "8x8x16",
    2048: "8x16x16",
    4096: "16x16x16",
    6144: "16x16x24",
}
TOPOLOGY_2D = {
    1: "1x1",
    4: "2x2",
    8: "2x4",
    16: "4x4",
    32: "4x8",
    64: "8x8",
    128: "8x16",
    256: "16x16",
}


@dataclasses.dataclass(frozen=True)
class Generation:
  """What one TPU generation is and how its slices are named.

  Attributes:
    counts: "cores" (N in `gen-N` counts TensorCores, 2 per chip) or "chips".
    per_vm: chips per host in multi-host slices.
    table: chip count -> default topology.
    largest: the largest slice in chips.
    xm_resource: the `xm.ResourceType` member name.
    gke_accelerator: the GKE node label `cloud.google.com/gke-tpu-accelerator`.
    jax_name: the generation's prefix in `get_topology_desc` topology names.
    chip_config: `get_topology_desc`'s chip_config_name.
    hbm_gib: HBM per chip (GiB).
    peak_bf16_flops: peak dense bfloat16 FLOP/s per chip.
  """

  counts: str
  per_vm: int
  table: dict[int, str]
  largest: int
  xm_resource: str
  gke_accelerator: str
  jax_name: str
  chip_config: str
  hbm_gib: float
  peak_bf16_flops: float


# HBM and peak bf16 figures from the Cloud TPU system architecture pages.
GENERATIONS = {
    "v4": Generation(
        "cores", 4, TOPOLOGY_3D, 4096, "TPU_V4", "tpu-v4-podslice", "v4",
        "megacore", 32.0, 275e12,
    ),  # fmt: skip
    "v5p": Generation(
        "cores", 4, TOPOLOGY_3D, 6144, "TPU_V5P", "tpu-v5p-slice", "v5",
        "megacore", 95.0, 459e12,
    ),  # fmt: skip
    "v5e": Generation(
        "chips", 4, TOPOLOGY_2D, 256, "TPU_V5E", "tpu-v5-lite-podslice",
        "v5e", "default", 16.0, 197e12,
    ),  # fmt: skip
    "v6e": Generation(
        "chips", 4, TOPOLOGY_2D, 256, "TPU_V6E", "tpu-v6e-slice", "v6e",
        "default", 32.0, 918e12,
    ),  # fmt: skip
}
ALIASES = {"v5litepod": "v5e", "v5lite": "v5e"}


class TopologyError(ValueError):
  """A slice name or shape Cloud TPU does not offer; says what to write."""


@dataclasses.dataclass(frozen=True)
class Slice:
  """One TPU slice.

  Attributes:
    generation: "v4", "v5p", "v5e" or "v6e".
    name: canonical name, e.g. "v5p-32".
    chips: chips in the slice (= JAX devices).
    hosts: VMs in the slice; one process each.
    per_host: chips on each host (JAX's local device count).
    topology: slice shape such as "2x2x4" (maybe with "_twisted").
  """

  generation: str
  name: str
  chips: int
  hosts: int
  per_host: int
  topology: str

  @property
  def spec(self) -> Generation:
    """The generation's table entry."""
    return GENERATIONS[self.generation]

  @property
  def hbm_gib(self) -> float:
    """HBM per chip, GiB."""
    return self.spec.hbm_gib

  @property
  def peak_bf16_flops(self) -> float:
    """Peak bfloat16 FLOP/s per chip."""
    return self.spec.peak_bf16_flops

  def topology_desc_args(self) -> dict[str, Any]:
    """Keyword arguments of `jax.experimental.topologies.get_topology_desc`."""
    dims = [int(d) for d in self.topology.split("_")[0].split("x")]
    if self.hosts == 1:
      host = dims + [1] * (3 - len(dims))
    else:
      # Multi-host slices of both shapes are made of 2x2 chip hosts.
      host = [2, 2, 1]
      if self.per_host != 4:
        raise TopologyError(
            f"{self.name}: {self.per_host} chips per host is not a layout"
            " this table knows"
        )
    return dict(
        platform="tpu",
        topology_name=f"{self.spec.jax_name}:{self.topology.split('_')[0]}",
        chip_config_name=self.spec.chip_config,
        chips_per_host_bounds=tuple(host),
        num_slices=1,
    )

  def devices(self) -> list[Any]:
    """The slice's devices as a CPU host sees them (compile-only, no chips).

    Needs `jax[tpu]` (libtpu) installed; see `spade.compile`.
    """
    from jax.experimental import topologies  # pylint: disable=g-import-not-at-top

    desc = topologies.get_topology_desc(**self.topology_desc_args())
    return list(desc.devices)


def parse(name: str, topology: str | None = None) -> Slice:
  """Parses `v5p-32`-style names into chips, hosts and topology.

  Args:
    name: `v4-N`, `v5p-N` (N TensorCores), `v5e-N`, `v5litepod-N` or `v6e-N`
      (N chips).
    topology: slice shape to use instead of the default one for that size,
      e.g. "4x4x8" or "4x4x8_twisted"; its chip count must match.

  Returns:
    The `Slice`.

  Raises:
    TopologyError: unknown generation or a size Cloud TPU does not offer.
  """
  match = re.fullmatch(r"([a-z0-9]+)-(\d+)", name.strip().lower())
  if not match:
    raise TopologyError(
        f"{name!r} is not a TPU slice name; write e.g. v5p-32, v4-8, "
        "v5e-16 or v6e-8"
    )
  gen, number = ALIASES.get(match[1], match[1]), int(match[2])
  if gen not in GENERATIONS:
    raise TopologyError(
        f"{name!r}: unknown TPU generation {match[1]!r}; one of "
        f"{sorted(GENERATIONS)}"
    )
  spec = GENERATIONS[gen]
  if spec.counts == "cores":
    if number % 8:
      raise TopologyError(
          f"{name}: {gen}-N counts TensorCores (2 per chip, 4 chips per "
          f"host), so N must be a multiple of 8, e.g. {gen}-8 or {gen}-32"
      )
    chips = number // 2
    hosts, per_host = chips // spec.per_vm, spec.per_vm
  else:
    if number not in spec.table:
      raise TopologyError(
          f"{name}: {gen} slices have {sorted(spec.table)} chips"
      )
    chips = number
    # 1-, 4- and 8-chip slices are one VM; larger ones are 4-chip VMs.
    if chips <= 8:
      hosts, per_host = 1, chips
    else:
      hosts, per_host = chips // spec.per_vm, spec.per_vm
  if chips > spec.largest:
    raise TopologyError(
        f"{name}: the largest {gen} slice has {spec.largest} chips"
    )
  if topology is None:
    if chips not in spec.table:
      raise TopologyError(
          f"{name}: no default topology for {chips} chips; pass an explicit"
          " topology AxBxC"
      )
    topology = spec.table[chips]
  else:
    shape = re.fullmatch(r"(\d+(?:x\d+)+)(_(un)?twisted)?", topology)
    dims = [int(d) for d in shape[1].split("x")] if shape else []
    if not shape or math.prod(dims) != chips:
      raise TopologyError(
          f"topology {topology!r} must be AxB or AxBxC with {chips} "
          f"chips in all for {name}"
      )
  return Slice(
      generation=gen,
      name=f"{gen}-{number}",
      chips=chips,
      hosts=hosts,
      per_host=per_host,
      topology=topology,
  )
