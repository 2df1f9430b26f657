"""A one-token step's MLP as one Pallas TPU kernel that gathers its input
and its hidden into VMEM (`config.model.decode_mlp_kernel`).

Under the tensor-axis pod configs' rules a decode step keeps its residual
stream with its rows whole and its width split over fsdp
(`layers.residual`), and gate and up are split over their hidden only
("decode_mlp"), so each chip needs every row's whole input. XLA gathers it
into HBM and the matmul reads it back: [256, 5,376] bf16, 2.6 MiB written
and read a layer on the Gemma 3 27B, more than a local layer's weights
there; then down gathers the hidden the same way. This kernel sends each
chip's piece of the input straight into the other fsdp chips' VMEM (remote
DMAs), multiplies it there with the chip's columns of gate and up, sends
its piece of act(gate) * up the same way, multiplies the gathered hidden
with its block of down and writes only down's partial sums, which XLA sums
over tensor after it: the rows never go through HBM.

The kernel works on the transposed operands, which is how XLA stores them
on a TPU (a [5,376, 168] shard has its 5,376 on the 128 lanes, a [256, 336]
one its rows), so no operand is laid out again: pieces of x^T [E / n, rows]
stack along the sublanes of one VMEM buffer [E, rows] (E / n a multiple of
16), and so do the hidden's (as float32, 8 rows a tile).

`fused(cfg, x)` says where it can run: under rules that keep gate and up's
input width whole and split down as the hidden is split, on a TPU mesh
("pallas") or anywhere in Pallas' TPU interpreter ("interpret": the tests,
on CPU); `layers.MLP` runs it in a one-token step that keeps its residual
in the decoding layout (`layers.residual_kept`). Elsewhere the MLP runs as
XLA's matmuls, the same values: gate, up, the hidden and down's partial
sums rounded to the activations' dtype as `layers.Linear` and `layers.MLP`
round them. Compiled by Mosaic for TPU slices from a CPU and checked in the
interpreter; not run on a TPU.
"""

from __future__ import annotations

import functools

import jax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
import jax.numpy as jnp

from spade.model import architecture
from spade.model import mesh_fit

P = jax.sharding.PartitionSpec

# A piece of x^T starts on a multiple of this many sublanes (bf16 packs 16
# rows a tile).
_SUBLANES = 16

# "interpret": each DMA runs as it starts, as a TPU's do (by default the
# interpreter runs one when it is waited on, which hides a read that does
# not wait), and a happens-before race detector watches every buffer; a
# race is printed and sets the interpreter's `races.races_found`.
_INTERPRET = pltpu.InterpretParams(
    dma_execution_mode="eager", detect_races=True
)


def fused(cfg: architecture.ModelConfig, x) -> bool:
  """Whether the MLP of a one-token step on x [rows, 1, embed] can run as
  the kernel under the trace's mesh and rules (`layers.MLP` runs it where
  the step also keeps its residual in the decoding layout,
  `layers.residual_kept`)."""
  if cfg.decode_mlp_kernel == "xla":
    return False
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return False
  if cfg.decode_mlp_kernel == "pallas":
    if getattr(mesh.abstract_device, "platform", None) != "tpu":
      return False
  width = mesh_fit.axis_names(mesh_fit.mesh_axes("decode_residual"))
  hidden = mesh_fit.axis_names(mesh_fit.mesh_axes("decode_mlp"))
  summed = mesh_fit.axis_names(mesh_fit.mesh_axes("decode_down"))
  # Down's rows are the hidden this chip's peers along the width's axis
  # hold (its hidden split over `summed`, then that axis), its columns the
  # width where the residual keeps it.
  if (
      len(width) != 1
      or hidden != summed + width
      or mesh_fit.axis_names(mesh_fit.mesh_axes("decode_embed")) != width
      or cfg.kernel_layout != "in_out"
  ):
    return False
  n = mesh.shape[width[0]]
  split = 1
  for a in hidden:
    split *= mesh.shape[a]
  return (
      x.shape[-1] % n == 0
      and (x.shape[-1] // n) % _SUBLANES == 0
      and cfg.mlp_dim % split == 0
      and (cfg.mlp_dim // split) % 8 == 0
  )


def _gather(buf, size, me, n, device, send, recv):
  """All of `axis`'s pieces into buf: this chip's piece (`size` sublanes at
  me * size, already there) sent into every other chip's buf, theirs
  received into this one's. Returns the sends, to wait on before the
  kernel ends."""

  def piece(j):
    return buf.at[pl.ds(pl.multiple_of(j * size, 8), size)]

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
  return sends


def _kernel(
    xt_ref,
    gate_ref,
    up_ref,
    down_ref,
    out_ref,
    xs,
    hs,
    sems,
    *,
    axis,
    axes,
    activation,
    dtype,
):
  me = lax.axis_index(axis)
  n = lax.axis_size(axis)
  size_e, size_h = xt_ref.shape[0], gate_ref.shape[0]

  def device(j):
    return tuple(j if a == axis else lax.axis_index(a) for a in axes)

  pltpu.sync_copy(xt_ref, xs.at[pl.ds(pl.multiple_of(me * size_e, 8), size_e)])
  # Every peer inside the kernel (its buffers allocated) before any DMA.
  barrier = pltpu.get_barrier_semaphore()
  for k in range(1, n):
    pl.semaphore_signal(barrier, 1, device_id=device(lax.rem(me + k, n)))
  pl.semaphore_wait(barrier, n - 1)
  sends = _gather(xs, size_e, me, n, device, sems.at[0], sems.at[1])
  x = xs[...]
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
  # The hidden's pieces travel as float32 (8 rows a tile; a piece of
  # 5,376 / 32 = 168 rows is not a whole number of bfloat16's 16-row
  # tiles), holding `dtype`'s values.
  start = pl.multiple_of(me * size_h, 8)
  hs[pl.ds(start, size_h), :] = (act * up).astype(dtype).astype(hs.dtype)
  sends += _gather(hs, size_h, me, n, device, sems.at[2], sems.at[3])
  # Down's partial sums over the hidden this chip's `axis` peers hold.
  out_ref[...] = jnp.dot(
      down_ref[...], hs[...].astype(dtype), preferred_element_type=jnp.float32
  ).astype(out_ref.dtype)
  for copy in sends:
    copy.wait_send()


def mlp(cfg: architecture.ModelConfig, x, gate, up, down):
  """down(act(x @ gate) * (x @ up)) for x [rows, embed] (rows over
  "decode_batch", the width over "decode_residual") and the decoding
  layout's kernels: gate, up [embed, mlp] (the hidden over "decode_mlp"),
  down [mlp, embed] ("decode_down", "decode_embed"). Returns [rows, embed]
  in `cfg.dtype` where x is. Call where `fused` says so.

  Each chip's partial sums (its hidden's share) are rounded to `cfg.dtype`
  and summed over "decode_down", as XLA sums `layers.Linear`'s."""
  mesh = jax.sharding.get_abstract_mesh()
  (axis,) = mesh_fit.axis_names(mesh_fit.mesh_axes("decode_residual"))
  rows = mesh_fit.mesh_axes("decode_batch")
  hidden = mesh_fit.mesh_axes("decode_mlp")
  down_rows = mesh_fit.mesh_axes("decode_down")
  summed = mesh_fit.axis_names(down_rows)
  dtype = jnp.dtype(cfg.dtype)
  interpret = cfg.decode_mlp_kernel == "interpret"

  def local(x, gate, up, down):
    r, e = x.shape[0], gate.shape[0]
    n = e // x.shape[1]
    vmem = pl.BlockSpec(memory_space=pltpu.VMEM)
    out = pl.pallas_call(
        functools.partial(
            _kernel,
            axis=axis,
            axes=mesh.axis_names,
            activation=cfg.mlp_activation,
            dtype=dtype,
        ),
        out_shape=jax.ShapeDtypeStruct((x.shape[1], r), dtype),
        in_specs=[vmem] * 4,
        out_specs=vmem,
        scratch_shapes=[
            pltpu.VMEM((e, r), dtype),
            pltpu.VMEM((down.shape[0], r), jnp.float32),
            pltpu.SemaphoreType.DMA((4, n)),
        ],
        compiler_params=pltpu.CompilerParams(collective_id=0),
        interpret=_INTERPRET if interpret else False,
        name="fused_mlp",
    )(x.T, gate.T, up.T, down.T)
    if summed:
      out = lax.psum(out, summed)
    return out.T

  w = P(None, hidden)
  return jax.shard_map(
      local,
      mesh=mesh,
      in_specs=(P(rows, axis), w, w, P(down_rows, axis)),
      out_specs=P(rows, axis),
      check_vma=False,
  )(*(a.astype(dtype) for a in (x, gate, up, down)))
