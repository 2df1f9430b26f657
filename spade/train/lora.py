"""Low-rank adapters (LoRA): train A @ B beside frozen weights.

`config.optim.lora_rank > 0` trains, for every projection kernel of the
trunk and every output layer, two factors A [..., left, r] and B [..., r, right]
instead of the kernel itself; the embedding table, norms and biases stay
frozen. This is the reference's Tinker backend (`train_spade_tinker.py`,
`lora_rank=32`); rank 0 (the default) is full fine-tuning, its slime backend.

How the state holds it: `TrainState.params` are always the weights the
model runs with (frozen weights plus the adapters' product), so sampling,
checkpoints and evaluation read them unchanged; `TrainState.adapters` holds
the factors and the optimizer state is over the factors only. The update
differentiates the loss at `params` with respect to the factors, each
projection adding a zero-valued term u - stop_gradient(u) with
u = stop_gradient(x)·A·(sB) (`attach`, `layers.LORA`), so no kernel's
gradient is formed, and then
moves `params` by the factors' change, s·(A'@B' - A@B), where
s = lora_alpha / lora_rank. So
Adam state and gradients of the full kernels are never stored across steps:
the 0.5B model's update keeps 2.9 GiB of weights plus a few MiB of factors
instead of 8.6 GiB of weights and Adam moments.

Which dimensions a kernel's factors split is read from its logical axes
(`layers.PARAM_AXES`): the "embed" side is one factor, the other axes
(heads x head_dim, mlp, vocab) the other, under the leading "layers" axis
of a scanned stack. A starts random (scaled by 1/sqrt(left size)), B at
zero, so the adapters start as the identity change.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from spade.model import layers
from spade.model import transformer

PyTree = Any
# Adapters are a flat dict keyed by the kernel's path ("layers/attn/q_proj/
# kernel"), each {"a": A, "b": B}: optax and orbax take it as any pytree.
Adapters = dict[str, dict[str, jax.Array]]

# Leaves that get factors (by name); the embedding table, norms and biases
# stay frozen.
_ADAPTED = ("kernel", layers.TRANSPOSED, "unembedding")


def _path(path) -> str:
  return "/".join(str(getattr(p, "key", p)) for p in path)


def _split(names: tuple[str, ...], axes: tuple[str, ...]):
  """(lead, left, right) axis counts of a kernel, or None if not adapted."""
  if names[-1] not in _ADAPTED:
    return None
  lead = 1 if axes[0] == "layers" else 0
  body = axes[lead:]
  if len(body) < 2 or "embed" not in (body[0], body[-1]):
    return None
  left = 1 if body[0] == "embed" else len(body) - 1
  return lead, left, len(body) - left


class _Kernel(NamedTuple):
  """An adapted leaf as its factors see it: [*lead, *in, *out] for every
  projection, whichever way it is stored (`model.kernel_layout`)."""

  axes: tuple[str, ...]
  shape: tuple[int, ...]
  dtype: Any
  back: tuple[int, ...] | None  # the view's axes -> the stored leaf's


def _view(names: tuple[str, ...], spec: tuple[str, ...], shape) -> _Kernel:
  """The factors' view of a leaf: a `kernel_t` [*lead, *out, *in] seen as
  [*lead, *in, *out], so its factors are those of the same `kernel`
  (A on the inputs, random; B on the outputs, zero)."""
  shape = tuple(shape)
  if names[-1] != layers.TRANSPOSED:
    return _Kernel(spec, shape, None, None)
  lead = 1 if spec[0] == "layers" else 0
  back = layers.out_in_axes(len(spec), layers.CONTRACTED[names[-2]], lead)
  order = tuple(int(i) for i in np.argsort(back))
  return _Kernel(
      tuple(spec[i] for i in order), tuple(shape[i] for i in order), None, back
  )


def _to_stored(change: jax.Array, back) -> jax.Array:
  """A change in the factors' view, in the stored leaf's layout (a layer
  of a stack: `change` has one axis fewer than `back` counts)."""
  if back is None:
    return change
  drop = len(back) - change.ndim
  return jnp.transpose(change, tuple(i - drop for i in back[drop:]))


def _specs(params: PyTree) -> dict[str, _Kernel]:
  """path -> the factors' view of every adapted kernel (`_view`)."""
  axes = transformer.param_logical_axes(params)
  out = {}

  def visit(path, leaf, spec):
    names = tuple(str(getattr(p, "key", p)) for p in path)
    view = _view(names, tuple(spec), np.shape(leaf))
    if _split(names, view.axes) is not None:
      out[_path(path)] = view._replace(dtype=leaf.dtype)

  jax.tree_util.tree_map_with_path(visit, params, axes)
  return out


def init_adapters(params: PyTree, rank: int, rng: jax.Array) -> Adapters:
  """Factors for every adapted kernel of `params`: A random, B zero.

  Works on arrays or `jax.ShapeDtypeStruct`s under `jax.eval_shape`; the
  factors take the kernels' dtype.
  """
  if rank < 1:
    raise ValueError(f"config.optim.lora_rank={rank} must be >= 1 here")
  adapters = {}
  for i, (path, view) in enumerate(sorted(_specs(params).items())):
    lead, left, right = _split(tuple(path.split("/")), view.axes)
    shape = view.shape
    lead_shape = shape[:lead]
    left_shape = shape[lead : lead + left]
    right_shape = shape[lead + left :]
    key = jax.random.fold_in(rng, i)
    fan_in = math.prod(left_shape)
    a = jax.random.normal(key, lead_shape + left_shape + (rank,), jnp.float32)
    adapters[path] = {
        "a": (a / math.sqrt(fan_in)).astype(view.dtype),
        "b": jnp.zeros(lead_shape + (rank,) + right_shape, view.dtype),
    }
  return adapters


def adapter_logical_axes(params: PyTree) -> dict[str, dict[str, tuple]]:
  """Logical axes of each factor: its kernel's, the rank axis unsharded."""
  out = {}
  for path, view in _specs(params).items():
    spec = view.axes
    lead, left, _ = _split(tuple(path.split("/")), spec)
    head, body = spec[:lead], spec[lead:]
    out[path] = {
        "a": head + body[:left] + (None,),
        "b": head + (None,) + body[left:],
    }
  return out


def product(adapter: dict[str, jax.Array], lead: int) -> jax.Array:
  """A @ B over the rank axis, batched over the `lead` leading axes."""
  a, b = adapter["a"], adapter["b"]
  a2 = a.reshape(a.shape[:lead] + (-1, a.shape[-1]))
  b2 = b.reshape(b.shape[: lead + 1] + (-1,))
  out = jnp.matmul(a2, b2, preferred_element_type=jnp.float32)
  return out.reshape(a.shape[:-1] + b.shape[lead + 1 :])


def _map_kernels(params: PyTree, adapters: Adapters, fn) -> PyTree:
  """params with fn(kernel, path, lead, back) at every kernel in `adapters`
  (`back`: `_view`'s, None for a kernel stored as its factors see it)."""
  axes = transformer.param_logical_axes(params)

  def visit(path, leaf, spec):
    key = _path(path)
    if key not in adapters:
      return leaf
    names = tuple(key.split("/"))
    view = _view(names, tuple(spec), np.shape(leaf))
    return fn(leaf, key, _split(names, view.axes)[0], view.back)

  return jax.tree_util.tree_map_with_path(visit, params, axes)


class Attached(NamedTuple):
  """Parameters with adapters attached: what the update's loss takes.

  `params` are the weights the model runs with; `lora` is the model's
  `layers.LORA` collection, {"a": A, "b": s·B} at each adapted
  module's path.
  """

  params: PyTree
  lora: PyTree


def attach(params: PyTree, adapters: Adapters, scale: float) -> Attached:
  """`params` whose gradient reaches `adapters`, with `params`' exact value.

  Each adapted projection adds u - stop_gradient(u), u =
  stop_gradient(x)·A·(sB), to its output (`layers.LORA`): zero, with
  the gradient of W + s·A@B at this point (x's gradient is W's alone: W
  already holds s·A@B). The kernels' own gradients (x^T·dy, a matmul as costly as the
  forward's) are never formed, and neither is A@B or a copy of W.
  """
  tree: dict[str, Any] = {}
  for path, factors in adapters.items():
    node = tree
    for key in path.split("/")[:-1]:  # the module's path, not the leaf
      node = node.setdefault(key, {})
    node["a"] = factors["a"]
    node["b"] = factors["b"] * jnp.asarray(scale, factors["b"].dtype)
  return Attached(params, tree)


def variables(params: PyTree | Attached) -> dict[str, PyTree]:
  """The `model.apply` variables of plain or `attach`ed parameters."""
  if isinstance(params, Attached):
    return {"params": params.params, layers.LORA: params.lora}
  return {"params": params}


def shift(params: PyTree, old: Adapters, new: Adapters, scale: float) -> PyTree:
  """`params` moved by the factors' change: W + s·(A'@B' - A@B)."""

  def moved(w, a, b, lead, back):
    change = _to_stored(product({"a": a, "b": b}, lead), back)
    return (w.astype(jnp.float32) + scale * change).astype(w.dtype)

  def fn(w, path, lead, back):
    # A'B' - AB as one product of rank 2r: [A', A] @ [B'; -B].
    a = jnp.concatenate([new[path]["a"], old[path]["a"]], axis=-1)
    b = jnp.concatenate([new[path]["b"], -old[path]["b"]], axis=lead)
    if lead == 0:
      return moved(w, a, b, 0, back)

    # A stacked kernel moves one layer at a time, in place: its change is
    # formed a layer's worth at a time, not whole beside it (the 1.5B's
    # stacked MLP kernels are 1.44 GiB each, and the whole changes of
    # several at once were the default run's peak).
    def layer(i, w):
      return w.at[i].set(moved(w[i], a[i], b[i], lead - 1, back))

    return jax.lax.fori_loop(0, w.shape[0], layer, w)

  return _map_kernels(params, old, fn)


def merged_delta(
    params: PyTree, adapters: Adapters, scale: float
) -> dict[str, jax.Array]:
  """path -> s·A@B of every adapter (what training has added to a kernel)."""
  specs = _specs(params)
  out = {}
  for k, v in adapters.items():
    lead = _split(tuple(k.split("/")), specs[k].axes)[0]
    out[k] = scale * _to_stored(product(v, lead), specs[k].back)
  return out
