"""The device mesh and the mapping from logical axis names to it.

The model names every parameter axis ("vocab", "embed", "heads", ...) and
every activation axis ("batch", "length", ...); `config.mesh.rules` maps those
names onto the mesh axes ("data", "fsdp", "tensor"), in priority order, as in
t5x/flax (`nn.logical_to_mesh_axes`): a mesh axis already used by an earlier
dimension of the same array is skipped, so with the default rules an
activation [batch, length, embed] is sharded over (data, fsdp) on batch only
while a weight [vocab, embed] is sharded over tensor and fsdp.

Typical use (pjit semantics):

  mesh = make_mesh(config.mesh)
  rules = config.mesh.rules
  params = shard_params(params, mesh, rules)
  with use_rules(mesh, rules):  # activation constraints see the mesh
    fn = jax.jit(step, in_shardings=(param_shardings(params, mesh, rules),
                                     batch_sharding(mesh, rules, 2)))
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Iterator, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils

from spade.model import layers
from spade.model import transformer

AXES = ("data", "fsdp", "tensor")

Rules = Sequence[tuple[str, Any]]


def mesh_shape(mesh_config, num_devices: int) -> tuple[int, int, int]:
  """Resolves (data, fsdp, tensor) sizes; one of them may be -1 (the rest).

  Raises:
    ValueError: a size is invalid, more than one is -1, or the product does
      not equal the device count.
  """
  sizes = [int(mesh_config[a]) for a in AXES]
  for axis, size in zip(AXES, sizes):
    if size == 0 or size < -1:
      raise ValueError(f"config.mesh.{axis}={size} must be -1 or >= 1")
  free = [a for a, s in zip(AXES, sizes) if s == -1]
  if len(free) > 1:
    raise ValueError(
        f"config.mesh: only one of {AXES} may be -1, got -1 for {free}"
    )
  fixed = math.prod(s for s in sizes if s != -1)
  if free:
    if num_devices % fixed:
      raise ValueError(
          f"config.mesh: the fixed axes multiply to {fixed}, which does not"
          f" divide the {num_devices} devices; change config.mesh."
          f"{'/'.join(a for a in AXES if a not in free)}"
      )
    sizes[AXES.index(free[0])] = num_devices // fixed
  elif fixed != num_devices:
    raise ValueError(
        f"config.mesh data*fsdp*tensor = {fixed} but there are {num_devices}"
        " devices; set one axis to -1 or make the product match"
    )
  return tuple(sizes)


def make_mesh(mesh_config, devices: Sequence[Any] | None = None):
  """A `jax.sharding.Mesh` with axes ("data", "fsdp", "tensor").

  Args:
    mesh_config: `config.mesh` (keys data, fsdp, tensor; -1 = the rest).
    devices: defaults to `jax.devices()`.

  Raises:
    ValueError: `mesh_shape`'s, or the sizes do not lie on a TPU slice's
      torus of chips (each axis a product of whole sides).
  """
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape(mesh_config, len(devices))
  try:
    grid = mesh_utils.create_device_mesh(shape, devices=devices)
  except NotImplementedError as e:
    # TPU chips sit on a torus, and XLA's collectives want each mesh axis
    # to be whole sides of it.
    torus = "x".join(str(n) for n in _torus(devices))
    sizes = ", ".join(f"{a}={n}" for a, n in zip(AXES, shape))
    raise ValueError(
        f"config.mesh ({sizes}) does not fit this slice's {torus} torus of"
        " chips: each of data, fsdp and tensor must be a product of some of"
        " the torus's sides, each side used once. Choose config.mesh sizes"
        " that are."
    ) from e
  return jax.sharding.Mesh(grid, AXES)


def _torus(devices) -> tuple[int, ...]:
  """The sides of the chips' torus (their coordinates' extents)."""
  coords = np.array([d.coords for d in devices if hasattr(d, "coords")])
  if not coords.size:
    return ()
  return tuple(int(n) for n in coords.max(0) - coords.min(0) + 1)


# Logical axes every rule table needs, with the split they take where a
# table (an older config's) leaves them out: a name the rules lack is
# unsharded, and the decoding layout's tables and MLP kernels (and the KV
# cache's heads) would then be whole on every chip.
_IMPLIED = (
    ("decode_vocab", ("fsdp", "tensor")),
    ("decode_mlp", ("fsdp", "tensor")),
    ("decode_down", ("fsdp", "tensor")),
    ("decode_embed", None),
    ("decode_residual", None),
    ("cache_heads", "tensor"),
)


def _rules(rules: Rules) -> tuple[tuple[str, Any], ...]:
  """Rules as hashable tuples (ConfigDicts may turn tuples into lists),
  with `_IMPLIED`'s names added where they are missing."""
  out = []
  for name, target in rules:
    if isinstance(target, list):
      target = tuple(target)
    out.append((name, target))
  named = {name for name, _ in out}
  out += [rule for rule in _IMPLIED if rule[0] not in named]
  return tuple(out)


def logical_sharding(mesh, rules: Rules, *axes: str | None):
  """NamedSharding for one array whose dimensions have these logical names."""
  spec = nn.logical_to_mesh_axes(axes, _rules(rules))
  return jax.sharding.NamedSharding(mesh, spec)


def batch_sharding(mesh, rules: Rules, ndim: int):
  """NamedSharding for a [batch, length, ...] input of `ndim` dimensions."""
  names = ("batch", "length") + (None,) * (ndim - 2)
  return logical_sharding(mesh, rules, *names[:ndim])


def param_shardings(params, mesh, rules: Rules) -> Any:
  """NamedSharding for every parameter (plain or boxed tree)."""
  specs = transformer.param_logical_axes(params)
  return nn.logical_to_mesh_sharding(specs, mesh, _rules(rules))


def shard_params(params, mesh, rules: Rules) -> Any:
  """Places a (plain or boxed) parameter tree on the mesh; returns it plain.

  A dimension whose size does not divide its mesh axes is replicated instead
  (e.g. the byte vocabulary 259 over tensor=2), so any model fits any mesh.
  """
  params = nn.unbox(params)
  return jax.device_put(params, fitted_param_shardings(params, mesh, rules))


_fit = layers.fit_sharding


def fitted_param_shardings(params, mesh, rules: Rules) -> Any:
  """`param_shardings` with the same divisibility fallback as `shard_params`
  (and the decoding layout's tables', `transformer.fitted_shardings`).

  Use as jit in/out shardings for trees placed by `shard_params`.
  """
  return transformer.fitted_shardings(nn.unbox(params), mesh, _rules(rules))


def fitted_logical_shardings(tree, logical_axes, mesh, rules: Rules) -> Any:
  """Shardings of `tree`'s leaves from a like tree of logical axis tuples.

  For arrays that are not model parameters (e.g. LoRA factors): each tuple
  names a leaf's logical axes (None: unsharded), mapped through `rules`
  with the same divisibility fallback as `shard_params`.
  """
  is_axes = lambda x: isinstance(x, tuple)
  specs = jax.tree.map(
      lambda a: jax.sharding.PartitionSpec(*a), logical_axes, is_leaf=is_axes
  )
  shardings = nn.logical_to_mesh_sharding(specs, mesh, _rules(rules))
  return jax.tree.map(_fit, tree, shardings)


@contextlib.contextmanager
def use_rules(mesh, rules: Rules) -> Iterator[None]:
  """Makes `mesh` and `rules` visible to the model's activation constraints.

  Trace jitted functions inside it; outside, the constraints are no-ops.
  """
  with jax.set_mesh(mesh), nn.logical_axis_rules(_rules(rules)):
    yield


def init_sharded_params(model_config, rng, mesh, rules: Rules) -> Any:
  """A scratch init created directly in its shards (no full copy anywhere).

  For models too large for one device (Gemma 3 12B/27B on a pod); the values
  equal `transformer.init_params(model_config, rng)`.
  """
  model = transformer.build_model(model_config)
  tokens = jax.numpy.zeros((1, 1), jax.numpy.int32)

  def init(rng):
    variables = model.init(rng, tokens, tokens, transformer.Role.DESIGNER)
    return nn.unbox(variables["params"])

  abstract = jax.eval_shape(init, rng)
  shardings = jax.tree.map(
      _fit, abstract, param_shardings(abstract, mesh, rules)
  )
  with use_rules(mesh, rules):
    return jax.jit(init, out_shardings=shardings)(rng)


def process_of(item: int, process_count: int) -> int:
  """The process that executes host-side item `item` (a program to validate,
  an episode, a document): round-robin, the one rule for every slice."""
  return item % process_count


def process_slice(n: int, process_index: int, process_count: int) -> range:
  """Items 0..n-1 that process `process_index` executes (`process_of`)."""
  return range(process_index, n, process_count)
