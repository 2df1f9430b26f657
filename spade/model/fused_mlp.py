"""A one-token step's gate and up as one Pallas TPU kernel that gathers its
input into VMEM (`config.model.decode_mlp_kernel`).

Under the tensor-axis pod configs' rules a decode step keeps its residual
stream with its rows whole and its width split over fsdp
(`layers.residual`), and gate and up are split over their hidden only
("decode_mlp"), so each chip needs every row's whole input. XLA gathers it
into HBM and the matmul reads it back: [256, 5,376] bf16, 2.6 MiB written
and read a layer on the Gemma 3 27B, more than a local layer's weights
there. This kernel sends each chip's piece straight into the other fsdp
chips' VMEM (remote DMAs), multiplies it there with the chip's columns of
gate and up, and writes only the hidden, act(gate) * up: the gathered rows
never go through HBM.

The kernel works on the transposed operands, which is how XLA stores them
on a TPU (a [5,376, 168] shard has its 5,376 on the 128 lanes, a [256, 336]
one its rows), so no operand is laid out again: pieces of x^T [E / n, rows]
stack along the sublanes of one VMEM buffer [E, rows] (E / n a multiple of
16), and the hidden comes out as h^T [columns, rows].

`fused(cfg, x)` says where it runs: a one-token step whose residual is kept
(`layers.residual_kept`), under rules that keep gate and up's input width
whole, on a TPU mesh ("pallas") or anywhere in Pallas' TPU interpreter
("interpret": the tests, on CPU). Elsewhere `layers.MLP` runs gate and up as
XLA matmuls, the same values: gate and up rounded to the activations' dtype
before act(gate) * up, as `layers.Linear` rounds them.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
import jax.numpy as jnp

from spade.model import architecture

P = jax.sharding.PartitionSpec

# A piece of x^T starts on a multiple of this many sublanes (bf16 packs 16
# rows a tile).
_SUBLANES = 16


def _mesh_axes(name: str):
  return nn.logical_to_mesh_axes((name,), nn.get_logical_axis_rules())[0]


def _names(axes) -> tuple[str, ...]:
  if axes is None:
    return ()
  return (axes,) if isinstance(axes, str) else tuple(axes)


def fused(cfg: architecture.ModelConfig, x, gathered: bool) -> bool:
  """Whether a step's gate and up on x [rows, 1, embed] run as the kernel.

  Args:
    cfg: the model config (`decode_mlp_kernel`).
    x: the MLP's input.
    gathered: whether the step keeps its residual in the decoding layout
      (`layers.residual_kept`), its width split over one mesh axis
      ("decode_residual").
  """
  if cfg.decode_mlp_kernel == "xla" or not gathered:
    return False
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return False
  if cfg.decode_mlp_kernel == "pallas":
    if getattr(mesh.abstract_device, "platform", None) != "tpu":
      return False
  width = _names(_mesh_axes("decode_residual"))
  hidden = _names(_mesh_axes("decode_mlp"))
  if len(width) != 1 or not hidden or cfg.kernel_layout != "in_out":
    return False
  n = mesh.shape[width[0]]
  split = 1
  for a in hidden:
    split *= mesh.shape[a]
  return (
      x.shape[-1] % n == 0
      and (x.shape[-1] // n) % _SUBLANES == 0
      and cfg.mlp_dim % split == 0
  )


def _kernel(
    xt_ref,
    gate_ref,
    up_ref,
    out_ref,
    buf,
    send,
    recv,
    *,
    axis,
    axes,
    activation,
    dtype,
):
  me = lax.axis_index(axis)
  n = lax.axis_size(axis)
  rows_e = xt_ref.shape[0]

  def device(j):
    return tuple(j if a == axis else lax.axis_index(a) for a in axes)

  def piece(j):
    return buf.at[pl.ds(pl.multiple_of(j * rows_e, _SUBLANES), rows_e)]

  pltpu.sync_copy(xt_ref, piece(me))
  # Every peer inside the kernel (its buffer allocated) before any DMA.
  barrier = pltpu.get_barrier_semaphore()
  for k in range(1, n):
    pl.semaphore_signal(barrier, 1, device_id=device(lax.rem(me + k, n)))
  pl.semaphore_wait(barrier, n - 1)
  sends = []
  for k in range(1, n):
    copy = pltpu.make_async_remote_copy(
        piece(me),
        piece(me),
        send.at[k],
        recv.at[me],
        device_id=device(lax.rem(me + k, n)),
    )
    copy.start()
    sends.append(copy)
  for k in range(1, n):
    j = lax.rem(me + n - k, n)
    pltpu.make_async_remote_copy(
        piece(j), piece(j), send.at[k], recv.at[j], device_id=device(j)
    ).wait_recv()
  x = buf[...]
  # As `layers.Linear` and `layers.MLP` round: gate and up to `dtype`,
  # act(gate) * up in float32, the hidden to `dtype`.
  gate = jnp.dot(gate_ref[...], x, preferred_element_type=jnp.float32)
  up = jnp.dot(up_ref[...], x, preferred_element_type=jnp.float32)
  gate = gate.astype(dtype).astype(jnp.float32)
  up = up.astype(dtype).astype(jnp.float32)
  if activation == "gelu":
    act = jax.nn.gelu(gate, approximate=True)
  else:
    act = jax.nn.silu(gate)
  out_ref[...] = (act * up).astype(out_ref.dtype)
  for copy in sends:
    copy.wait_send()


def gate_up(cfg: architecture.ModelConfig, x, gate, up):
  """act(x @ gate) * (x @ up) for x [rows, embed] (rows over
  "decode_batch", the width over "decode_residual") and gate, up [embed,
  mlp] (the hidden over "decode_mlp"); [rows, mlp] in `cfg.dtype`, split as
  gate and up's hidden. Call where `fused` says so."""
  mesh = jax.sharding.get_abstract_mesh()
  (axis,) = _names(_mesh_axes("decode_residual"))
  rows = _mesh_axes("decode_batch")
  hidden = _mesh_axes("decode_mlp")
  dtype = jnp.dtype(cfg.dtype)
  interpret = cfg.decode_mlp_kernel == "interpret"

  def local(x, gate, up):
    r, e = x.shape[0], gate.shape[0]
    n = e // x.shape[1]
    vmem = pl.BlockSpec(memory_space=pltpu.VMEM)
    ht = pl.pallas_call(
        functools.partial(
            _kernel,
            axis=axis,
            axes=mesh.axis_names,
            activation=cfg.mlp_activation,
            dtype=dtype,
        ),
        out_shape=jax.ShapeDtypeStruct((gate.shape[1], r), dtype),
        in_specs=[vmem, vmem, vmem],
        out_specs=vmem,
        scratch_shapes=[
            pltpu.VMEM((e, r), dtype),
            pltpu.SemaphoreType.DMA((n,)),
            pltpu.SemaphoreType.DMA((n,)),
        ],
        compiler_params=pltpu.CompilerParams(collective_id=0),
        interpret=pltpu.InterpretParams() if interpret else False,
        name="fused_gate_up",
    )(x.T, gate.T, up.T)
    return ht.T

  w = P(None, hidden)
  return jax.shard_map(
      local,
      mesh=mesh,
      in_specs=(P(rows, axis), w, w),
      out_specs=P(rows, hidden),
      check_vma=False,
  )(x.astype(dtype), gate.astype(dtype), up.astype(dtype))
