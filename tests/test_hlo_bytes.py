"""`spade.hlo_bytes`: XLA's bytes accessed, op by op, by category.

The compiled slot engine's breakdown (it sums to XLA's total) is checked in
`tests/test_compile.py`, on a TPU slice's compile; here, the rules on a
hand-written module whose bytes are counted by hand.
"""

import pytest

from spade import hlo_bytes

# A decode loop in miniature: the entry takes a weight (p[...]) and a cache
# (st['cache']...), copies the cache, and a while loop whose body reads the
# weight and the cache in one fusion and writes a row into the cache in
# place (a fusion whose root is a dynamic-update-slice). Its condition is
# not a counted loop's (`i != 4`; the engine's stops on its rows' state).
_MODULE = """\
HloModule jit_step, is_scheduled=true

%fused_dus (param_0: f32[8,128], param_1: f32[1,128], param_2: s32[]) -> f32[8,128] {
  %param_0 = f32[8,128]{1,0:T(8,128)} parameter(0)
  %param_1 = f32[1,128]{1,0:T(8,128)} parameter(1)
  %param_2 = s32[]{:T(128)} parameter(2)
  %c = s32[]{:T(128)} constant(0)
  ROOT %dus = f32[8,128]{1,0:T(8,128)} dynamic-update-slice(%param_0, %param_1, %param_2, %c)
}

%fused_dot (param_0: f32[128,128], param_1: f32[8,128]) -> f32[1,128] {
  %param_0 = f32[128,128]{1,0:T(8,128)} parameter(0)
  %param_1 = f32[8,128]{1,0:T(8,128)} parameter(1)
  %s = f32[1,128]{1,0:T(8,128)} slice(%param_1), slice={[0:1], [0:128]}
  ROOT %d = f32[1,128]{1,0:T(8,128)} dot(%s, %param_0), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%body (arg: (s32[], f32[128,128], f32[8,128])) -> (s32[], f32[128,128], f32[8,128]) {
  %arg = (s32[]{:T(128)}, f32[128,128]{1,0:T(8,128)}, f32[8,128]{1,0:T(8,128)}) parameter(0)
  %i = s32[]{:T(128)} get-tuple-element(%arg), index=0
  %w = f32[128,128]{1,0:T(8,128)} get-tuple-element(%arg), index=1
  %k = f32[8,128]{1,0:T(8,128)} get-tuple-element(%arg), index=2
  %row = f32[1,128]{1,0:T(8,128)} fusion(%w, %k), kind=kOutput, calls=%fused_dot, metadata={op_name="jit(step)/while/body/dot_general"}
  %k2 = f32[8,128]{1,0:T(8,128)} fusion(%k, %row, %i), kind=kLoop, calls=%fused_dus, metadata={op_name="jit(step)/while/body/dynamic_update_slice"}
  %one = s32[]{:T(128)} constant(1)
  %i2 = s32[]{:T(128)} add(%i, %one)
  ROOT %t = (s32[]{:T(128)}, f32[128,128]{1,0:T(8,128)}, f32[8,128]{1,0:T(8,128)}) tuple(%i2, %w, %k2)
}

%cond (arg: (s32[], f32[128,128], f32[8,128])) -> pred[] {
  %arg = (s32[]{:T(128)}, f32[128,128]{1,0:T(8,128)}, f32[8,128]{1,0:T(8,128)}) parameter(0)
  %i = s32[]{:T(128)} get-tuple-element(%arg), index=0
  %n = s32[]{:T(128)} constant(4)
  ROOT %lt = pred[]{:T(512)} compare(%i, %n), direction=NE
}

ENTRY %main (p0: f32[128,128], p1: f32[8,128]) -> f32[8,128] {
  %p0 = f32[128,128]{1,0:T(8,128)} parameter(0), metadata={op_name="p['w']"}
  %p1 = f32[8,128]{1,0:T(8,128)} parameter(1), metadata={op_name="st['cache']['k']"}
  %copy = f32[8,128]{1,0:T(8,128)} copy(%p1)
  %zero = s32[]{:T(128)} constant(0)
  %init = (s32[]{:T(128)}, f32[128,128]{1,0:T(8,128)}, f32[8,128]{1,0:T(8,128)}) tuple(%zero, %p0, %copy)
  %loop = (s32[]{:T(128)}, f32[128,128]{1,0:T(8,128)}, f32[8,128]{1,0:T(8,128)}) while(%init), condition=%cond, body=%body
  ROOT %out = f32[8,128]{1,0:T(8,128)} get-tuple-element(%loop), index=2
}
"""

W = 128 * 128 * 4  # the weight
K = 8 * 128 * 4  # the cache
ROW = 8 * 128 * 4  # one row, padded to an (8, 128) tile
SCALAR = 128 * 4  # a scalar fills a tile's minor row
PRED = 512  # pred[] in a T(512) tile
TUPLE = 3 * 8  # a 3-tuple's pointer table


def test_shapes_are_padded_to_their_tiles():
  assert hlo_bytes.shape_bytes("f32[1,128]{1,0:T(8,128)}") == ROW
  assert hlo_bytes.shape_bytes("bf16[3,200]{1,0:T(8,128)(2,1)}") == 8 * 256 * 2
  assert hlo_bytes.shape_bytes("s32[]{:T(128)}") == SCALAR
  assert hlo_bytes.shape_bytes("f32[5,3]") == 60  # no layout: dense
  # Minor-to-major {0,1}: dimension 0 is the minor one, padded to 128.
  assert hlo_bytes.shape_bytes("f32[3,5]{0,1:T(8,128)}") == 8 * 128 * 4
  assert hlo_bytes.shape_bytes("(f32[2], s32[])") == 16


def test_a_decode_loop_is_split_by_what_each_byte_is():
  b = hlo_bytes.breakdown_text(_MODULE, xla_total=0.0)
  assert b.bytes == {
      # The loop body's dot fusion reads the weight once.
      "weights": W,
      # ... and the cache row's buffer whole, as does the in-place update.
      "cache_read": 2 * K,
      # The update writes its row only (operand 0 is updated in place),
      # and reads the row and its index to do so.
      "cache_write": ROW + ROW + SCALAR,
      # The entry's copy of the cache: read and written.
      "copy": 2 * K,
      "gather_scatter": 0,
      "all_gather": 0,
      # The tuples' pointer tables (the loop's carried state).
      "loop_state": 2 * TUPLE,
      # The dot's result, the counter's add (two scalars in, one out), the
      # condition's compare (two in, a pred out).
      "other": ROW + 3 * SCALAR + 2 * SCALAR + PRED,
  }
  assert b.unexplained == 0.0  # no XLA total given
  # Outside the loop: the cache's copy and the initial tuple, once a call.
  assert sum(b.outside.values()) == 2 * K + TUPLE
  names = [label.split()[0] for _, _, label in b.top]
  assert names[:3] == ["row", "k2", "copy"]


def test_hbm_traffic_leaves_out_the_buffer_an_update_writes_into():
  """XLA counts the fused in-place update's buffer read whole; it is written
  where it lies, so HBM traffic has only the update. A fusion that also
  reads the buffer (here: adds its first row to the update) reads it."""
  b = hlo_bytes.breakdown_text(_MODULE)
  assert b.bytes["cache_read"] == 2 * K
  assert b.hbm["cache_read"] == ROW  # the row the dot slices, only
  assert b.hbm["cache_write"] == b.bytes["cache_write"] == ROW + ROW + SCALAR
  reads = _MODULE.replace(
      "  ROOT %dus = f32[8,128]{1,0:T(8,128)} dynamic-update-slice(%param_0,"
      " %param_1, %param_2, %c)",
      "  %first = f32[1,128]{1,0:T(8,128)} slice(%param_0), slice={[0:1],"
      " [0:128]}\n"
      "  %sum = f32[1,128]{1,0:T(8,128)} add(%first, %param_1)\n"
      "  ROOT %dus = f32[8,128]{1,0:T(8,128)} dynamic-update-slice(%param_0,"
      " %sum, %param_2, %c)",
  )  # fmt: skip
  assert "%sum" in reads
  assert hlo_bytes.breakdown_text(reads).hbm["cache_read"] == 2 * K


_SLICED = """HloModule sliced

%fused_rows (param_0: f32[64,128], param_1: f32[64,128]) -> f32[8,128] {
  %param_0 = f32[64,128]{1,0:T(8,128)} parameter(0)
  %param_1 = f32[64,128]{1,0:T(8,128)} parameter(1)
  %rows = f32[8,128]{1,0:T(8,128)} slice(%param_0), slice={[8:16], [0:128]}
  %all = f32[8,128]{1,0:T(8,128)} slice(%param_1), slice={[0:8], [0:128]}
  %m = f32[64,128]{1,0:T(8,128)} negate(%param_1)
  %more = f32[8,128]{1,0:T(8,128)} slice(%m), slice={[8:16], [0:128]}
  %s = f32[8,128]{1,0:T(8,128)} add(%rows, %all)
  ROOT %out = f32[8,128]{1,0:T(8,128)} add(%s, %more)
}

ENTRY %main (p0: f32[64,128], p1: f32[64,128]) -> f32[8,128] {
  %p0 = f32[64,128]{1,0:T(8,128)} parameter(0), metadata={op_name="st['cache']['k']"}
  %p1 = f32[64,128]{1,0:T(8,128)} parameter(1), metadata={op_name="st['cache']['v']"}
  ROOT %f = f32[8,128]{1,0:T(8,128)} fusion(%p0, %p1), kind=kLoop, calls=%fused_rows
}
"""


def test_hbm_traffic_reads_only_the_slices_a_fusion_takes():
  """XLA counts a fused operand whole; from HBM a fusion that only slices it
  reads the slices. One that also reads it otherwise (param_1, negated
  whole) reads it whole."""
  b = hlo_bytes.breakdown_text(_SLICED)
  whole = 64 * 128 * 4
  assert b.bytes["cache_read"] == 2 * whole
  assert b.hbm["cache_read"] == ROW + whole


_GATHERED = """HloModule gathered

%fused_lookup (param_0: bf16[4096,256], param_1: s32[16,1], param_2: bf16[4096,256]) -> bf16[16,256] {
  %param_0 = bf16[4096,256]{1,0:T(8,128)(2,1)} parameter(0)
  %param_1 = s32[16,1]{1,0:T(8,128)} parameter(1)
  %param_2 = bf16[4096,256]{1,0:T(8,128)(2,1)} parameter(2)
  %rows = bf16[16,256]{1,0:T(8,128)(2,1)} gather(%param_0, %param_1), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,256}
  %m = bf16[4096,256]{1,0:T(8,128)(2,1)} negate(%param_2)
  %more = bf16[16,256]{1,0:T(8,128)(2,1)} gather(%m, %param_1), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,256}
  ROOT %out = bf16[16,256]{1,0:T(8,128)(2,1)} add(%rows, %more)
}

ENTRY %main (p0: bf16[4096,256], p1: s32[16,1], p2: bf16[4096,256]) -> bf16[16,256] {
  %p0 = bf16[4096,256]{1,0:T(8,128)(2,1)} parameter(0), metadata={op_name="p['embedder']['input_embedding']"}
  %p1 = s32[16,1]{1,0:T(8,128)} parameter(1)
  %p2 = bf16[4096,256]{1,0:T(8,128)(2,1)} parameter(2), metadata={op_name="p['heads']['shared']['unembedding']"}
  ROOT %f = bf16[16,256]{1,0:T(8,128)(2,1)} fusion(%p0, %p1, %p2), kind=kLoop, calls=%fused_lookup
}
"""


def test_hbm_traffic_reads_only_the_rows_a_gather_takes():
  """An embedding lookup reads the tokens' rows of the table (p0), not the
  table; a table the fusion also reads whole (p2, negated) still pays for
  it whole. XLA's own count takes both whole."""
  b = hlo_bytes.breakdown_text(_GATHERED)
  table, rows = 4096 * 256 * 2, 16 * 256 * 2
  assert b.bytes["weights"] == 2 * table
  assert b.hbm["weights"] == rows + table


def test_a_slice_in_a_nested_fusion_reads_what_it_takes():
  """The slot engine's calls on a prefix of each shard's rows: XLA's TPU
  compile fuses the slice of the cache into the matmul's operand as a
  fusion nested in the matmul's. From HBM that reads the slice, as the flat
  slice does (p0: 8 of its 64 rows); one whose nested fusion also reads
  the operand otherwise (p1's, negated) reads it whole."""
  nested = _SLICED.replace(
      "%fused_rows (param_0",
      """%nested_rows (param_0: f32[64,128]) -> f32[8,128] {
  %param_0 = f32[64,128]{1,0:T(8,128)} parameter(0)
  ROOT %r = f32[8,128]{1,0:T(8,128)} slice(%param_0), slice={[8:16], [0:128]}
}

%nested_more (param_0: f32[64,128]) -> f32[8,128] {
  %param_0 = f32[64,128]{1,0:T(8,128)} parameter(0)
  %m = f32[64,128]{1,0:T(8,128)} negate(%param_0)
  ROOT %r = f32[8,128]{1,0:T(8,128)} slice(%m), slice={[8:16], [0:128]}
}

%fused_rows (param_0""",
  )
  nested = (
      nested.replace(
          "%rows = f32[8,128]{1,0:T(8,128)} slice(%param_0), slice={[8:16],"
          " [0:128]}",
          "%rows = f32[8,128]{1,0:T(8,128)} fusion(%param_0), kind=kLoop,"
          " calls=%nested_rows",
      )
      .replace(
          "%more = f32[8,128]{1,0:T(8,128)} slice(%m), slice={[8:16], [0:128]}",
          "%more = f32[8,128]{1,0:T(8,128)} fusion(%param_1), kind=kLoop,"
          " calls=%nested_more",
      )
      .replace("  %m = f32[64,128]{1,0:T(8,128)} negate(%param_1)\n", "")
  )
  assert nested.count("kind=kLoop, calls=%nested_") == 2
  b = hlo_bytes.breakdown_text(nested)
  flat = hlo_bytes.breakdown_text(_SLICED)
  whole = 64 * 128 * 4
  assert b.hbm["cache_read"] == flat.hbm["cache_read"] == ROW + whole
  assert b.bytes["cache_read"] == 2 * whole


def test_an_update_in_place_through_a_fused_fusion_counts_as_one():
  # XLA's TPU compiles can nest a fusion in a fusion (the gathered slot
  # engine's programs do): the outer fusion's value is the inner one's
  # in-place update of the cache, and it costs what the flat update does.
  nested = _MODULE.replace(
      "%body (arg",
      """%wrap_dus (param_0: f32[8,128], param_1: f32[1,128], param_2: s32[]) -> f32[8,128] {
  %param_0 = f32[8,128]{1,0:T(8,128)} parameter(0)
  %param_1 = f32[1,128]{1,0:T(8,128)} parameter(1)
  %param_2 = s32[]{:T(128)} parameter(2)
  ROOT %inner = f32[8,128]{1,0:T(8,128)} fusion(%param_0, %param_1, %param_2), kind=kLoop, calls=%fused_dus
}

%body (arg""",
  ).replace("calls=%fused_dus, metadata", "calls=%wrap_dus, metadata")
  assert "calls=%wrap_dus" in nested
  flat = hlo_bytes.breakdown_text(_MODULE)
  b = hlo_bytes.breakdown_text(nested)
  assert b.bytes == flat.bytes and b.hbm == flat.hbm
  assert b.bytes["cache_write"] == ROW + ROW + SCALAR


def test_a_counted_loop_counts_every_trip_once_a_call():
  # The same loop as a fori_loop's (i < 4 from 0): its body and condition
  # run 4 times a call, and none of it is a decode step's.
  counted = _MODULE.replace("direction=NE", "direction=LT")
  b = hlo_bytes.breakdown_text(counted)
  assert b.bytes == {
      "weights": 4 * W,
      "cache_read": 4 * 2 * K,
      "cache_write": 4 * (ROW + ROW + SCALAR),
      "copy": 2 * K,
      "gather_scatter": 0,
      "all_gather": 0,
      "loop_state": TUPLE + 4 * TUPLE,
      "other": 4 * (ROW + 3 * SCALAR) + 4 * (2 * SCALAR + PRED),
  }
  assert b.outside == b.bytes
  # A loop the rule does not take for counted (`i != 4`) is a step's.
  uncounted = hlo_bytes.breakdown_text(_MODULE)
  assert uncounted.bytes["weights"] == W
  assert sum(uncounted.outside.values()) == 2 * K + TUPLE


def test_unexplained_is_what_xla_counts_beyond_the_rules():
  b = hlo_bytes.breakdown_text(_MODULE, xla_total=1e6)
  assert b.unexplained == pytest.approx(1e6 - b.total)
  pairs = dict(kv.split("=") for kv in b.lines("g_", scale=2.0))
  assert float(pairs["g_weights_mib"]) == pytest.approx(2 * W / 2**20, abs=0.01)
  assert set(pairs) == {f"g_{k}_mib" for k in hlo_bytes.CATEGORIES} | {
      f"g_hbm_{k}_mib" for k in hlo_bytes.CATEGORIES
  } | {
      "g_total_mib", "g_outside_loops_mib", "g_xla_total_mib",
      "g_unexplained_mib", "g_hbm_outside_loops_mib",
  }  # fmt: skip
  # The HBM split beside XLA's, at the same scale.
  assert float(pairs["g_hbm_weights_mib"]) == pytest.approx(
      2 * b.hbm["weights"] / 2**20, abs=0.01
  )


def test_a_module_without_an_entry_is_an_error():
  with pytest.raises(ValueError, match="no ENTRY"):
    hlo_bytes.breakdown_text("HloModule empty\n")


def test_hbm_bytes_leave_out_what_lives_in_vmem():
  # The entry's copy of the cache lands in VMEM (memory space S(1)), as
  # the TPU compiler's prefetches do: its write moves no HBM bytes, its
  # read of the HBM cache does.
  vmem = _MODULE.replace(
      "%copy = f32[8,128]{1,0:T(8,128)} copy",
      "%copy = f32[8,128]{1,0:T(8,128)S(1)} copy",
  )
  assert vmem != _MODULE
  b = hlo_bytes.breakdown_text(vmem)
  assert b.bytes == hlo_bytes.breakdown_text(_MODULE).bytes
  # Without a memory space the HBM view is every array's bytes.
  plain = hlo_bytes.breakdown_text(_MODULE)
  assert plain.hbm["copy"] == 2 * K and plain.hbm["weights"] == W
  # Read from HBM, written to VMEM: a prefetch, whose HBM traffic is a
  # read of the cache.
  assert b.hbm["copy"] == 0
  assert b.hbm["cache_read"] == plain.hbm["cache_read"] + K
  assert b.hbm["weights"] == W
  # The tuples' pointer tables are not HBM traffic either.
  assert b.hbm["loop_state"] == 0
  assert sum(b.hbm_outside.values()) == K
  assert b.hbm_outside["cache_read"] == K
  # The costliest operations by HBM traffic: the copy is its read alone.
  sizes = {label.split()[0]: size for size, _, label in b.hbm_top}
  assert sizes["copy"] == K
  assert {label.split()[0]: size for size, _, label in b.top}["copy"] == 2 * K
  assert [x[0] for x in b.hbm_top] == sorted(
      (x[0] for x in b.hbm_top), reverse=True
  )
