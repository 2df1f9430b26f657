"""Where a compiled program's bytes go: XLA's `bytes accessed`, op by op.

`compiled.cost_analysis()["bytes accessed"]` is one number: the sum over
the program's operations (a while loop's body and condition counted once,
a fusion's operands and results only) of the bytes each reads and writes,
by XLA's `HloCostAnalysis`. `breakdown` recomputes that sum from the
compiled program's HLO text (`compiled.as_text()`), operation by operation,
with the same rules:

* an operation reads its operands and writes its result (padded to the
  layout's tiles, as the TPU compiler sizes them);
* a fusion reads each fused parameter whole, even one it only slices or
  one a root `dynamic-update-slice` updates in place (as the TPU
  compiler's own analysis counts it);
* `get-tuple-element`, `parameter`, `constant`, `bitcast` and the like move
  no bytes; `tuple` writes its pointer table; slices, gathers and
  `dynamic-update-slice` read and write the slice, not the buffer; a
  `while` is its body plus its condition, a `call` its callee, a
  `conditional` its costliest branch;

and files each operand's and result's bytes under a category:

  weights        reads of the program's parameters (`metadata op_name`
                 of the entry parameter: `p[...]`, the model's weights);
  cache_read     reads of the KV cache (`...['cache']...`);
  cache_write    writes into the KV cache (a result that is, or updates in
                 place, a cache buffer) and what an in-place update reads
                 besides the cache (the new entries, their index);
  copy           `copy`, `copy-start` / `copy-done` and `transpose` (a
                 buffer moved, not computed on), whatever it holds;
  all_gather     collectives that assemble a sharded buffer on every
                 device (`all-gather`: the shard read, the whole written),
                 e.g. FSDP-sharded weights gathered for a step;
  gather_scatter `gather`, `scatter`, `dynamic-slice` and
                 `dynamic-update-slice` outside fusions, and fusions whose
                 root is one, other than the cache's in-place updates;
  loop_state     reads and writes of the loop's other carried entries
                 (per-slot tokens, positions, keys, the output buffers);
  other          everything else: activations, logits, sampling.

A buffer's category follows it through `get-tuple-element`, `bitcast`,
`copy`, `convert`, `all-gather`, the while loop's carried tuple and fusions
that update it in place, so a cache row read in the loop body is
`cache_read` and a gathered weight read by a matmul `weights`, wherever it
came from. `Breakdown.outside` is the part of each category spent outside
every while loop: once per call, where the loop body's bytes are once per
step (XLA's total counts both once). A counted loop (a `fori_loop`: its
condition compares the carried counter with a constant, `LT`, from a
constant start) is not a step's: its body and condition are counted as
many times as it runs, where it runs (outside the decode loop: once a
call), and XLA's total, which counts them once, falls short by the rest.
`Breakdown.hbm` is the HBM traffic by the same rules, less what XLA counts
that does not move through HBM: arrays the layout places in another memory
space (VMEM), the buffer of a fused in-place update (written where it
lies, update only), and the part of a fused operand that the fusion only
slices or gathers and does not take (an embedding lookup reads the
tokens' rows, not the table). The figures are per device (the compiled program
is one device's); XLA's own total comes beside them, and
`Breakdown.unexplained` is what this accounting does not reproduce (an
operation whose bytes XLA counts as unknown, a rule of the TPU compiler's
own analysis).
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Iterable

CATEGORIES = (
    "weights",
    "cache_read",
    "cache_write",
    "copy",
    "gather_scatter",
    "all_gather",
    "loop_state",
    "other",
)

_ITEMSIZE = {
    "pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "f8e4m3fn": 1,
    "f8e5m2": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
    "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
}  # fmt: skip
_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([0-9,]*)\](\{[^}]*\})?")
_HEADER = re.compile(r"^(ENTRY )?%([\w.\-]+) ")
_NAME = re.compile(r"%([\w.\-]+)")
# Operations that only name a buffer (or a piece of one) and move nothing.
_FREE = {
    "parameter", "constant", "get-tuple-element", "bitcast", "after-all",
    "partition-id", "replica-id", "iota", "opt-barrier", "domain",
    "add-dependency",
}  # fmt: skip
_MOVES = {"copy", "copy-start", "copy-done", "transpose"}
_INDEXED = {"gather", "scatter", "dynamic-slice", "dynamic-update-slice"}
_POINTER = 8  # a tuple's pointer table entry
# A layout's memory space other than the default (HBM): `...S(1)}`.
_MEMORY_SPACE = re.compile(r"S\([1-9][0-9]*\)")


def _array_bytes(
    dtype: str, dims: str, layout: str | None, hbm_only: bool = False
) -> float:
  """Bytes of one array, its dimensions padded to its layout's first tile
  (`{minor_to_major:T(a,b)...}`): what the TPU compiler allocates. With
  `hbm_only`, 0 for an array the layout places in another memory space
  (`S(1)`: the core's VMEM, where the compiler prefetches operands with
  `copy-start`; `S(2)`: scalar memory): no HBM bandwidth moves it."""
  if dtype not in _ITEMSIZE:
    return 0.0
  if hbm_only and layout and _MEMORY_SPACE.search(layout):
    return 0.0
  shape = [int(d) for d in dims.split(",") if d]
  if layout:
    body = layout[1:-1]
    order, _, rest = body.partition(":")
    tile = re.match(r"T\(([0-9,]+)\)", rest)
    if tile and not shape:
      # A scalar fills one tile's minor row.
      shape = [int(tile.group(1).split(",")[-1])]
    elif tile:
      minor = [int(i) for i in order.split(",") if i]
      sizes = [int(t) for t in tile.group(1).split(",")]
      # The tile's last entry is the most minor dimension's.
      for t, d in zip(reversed(sizes), minor):
        shape[d] = -(-shape[d] // t) * t
  return math.prod(shape) * _ITEMSIZE[dtype]


def shape_bytes(shape: str, hbm_only: bool = False) -> float:
  """Bytes of an HLO shape string: an array's (tile-padded), or a tuple's
  pointer table (its elements are other buffers); `hbm_only` as for
  `_array_bytes`."""
  shape = shape.strip()
  if shape.startswith("("):
    return 0.0 if hbm_only else _POINTER * len(_split_tuple(shape))
  m = _ARRAY.match(shape)
  return _array_bytes(*m.groups(), hbm_only=hbm_only) if m else 0.0


def _split_tuple(shape: str) -> list[str]:
  """The element shapes of a tuple shape string `(a, b, ...)`."""
  inner = re.sub(r"/\*[^*]*\*/", "", shape.strip()[1:-1])
  out, depth, start = [], 0, 0
  for i, ch in enumerate(inner):
    if ch in "({[":
      depth += 1
    elif ch in ")}]":
      depth -= 1
    elif ch == "," and depth == 0:
      out.append(inner[start:i].strip())
      start = i + 1
  if inner[start:].strip():
    out.append(inner[start:].strip())
  return out


def _balanced(text: str, start: int) -> int:
  """The index just past the bracket group that opens at `start`."""
  depth = 0
  for i in range(start, len(text)):
    if text[i] in "({[":
      depth += 1
    elif text[i] in ")}]":
      depth -= 1
      if depth == 0:
        return i + 1
  return len(text)


@dataclasses.dataclass
class Op:
  """One HLO instruction: its name, result shape, opcode, operand names and
  the rest of its line (attributes)."""

  name: str
  shape: str
  opcode: str
  operands: list[str]
  attrs: str
  args: str = ""
  root: bool = False

  @property
  def parameter_number(self) -> int:
    return int(self.args)

  def attr(self, key: str) -> str | None:
    m = re.search(rf"\b{key}=%([\w.\-]+)", self.attrs)
    return m.group(1) if m else None

  @property
  def op_name(self) -> str:
    m = re.search(r'op_name="((?:[^"\\]|\\.)*)"', self.attrs)
    return m.group(1) if m else ""

  @property
  def elements(self) -> list[str]:
    """The result's element shapes (one for an array)."""
    if self.shape.startswith("("):
      return _split_tuple(self.shape)
    return [self.shape]


def _parse_op(line: str) -> Op | None:
  line = line.strip()
  root = line.startswith("ROOT ")
  if root:
    line = line[5:]
  if not line.startswith("%") or " = " not in line:
    return None
  name, rest = line[1:].split(" = ", 1)
  if rest.startswith("("):
    end = _balanced(rest, 0)
  else:
    end = rest.index(" ")
  shape, rest = rest[:end], rest[end:].lstrip()
  paren = rest.index("(")
  opcode = rest[:paren]
  close = _balanced(rest, paren)
  operands = _NAME.findall(rest[paren:close])
  return Op(
      name,
      shape,
      opcode,
      operands,
      rest[close:],
      rest[paren + 1 : close - 1],
      root,
  )


def parse(text: str) -> tuple[dict[str, list[Op]], str]:
  """The HLO module's computations (name -> its ops in order) and the
  entry computation's name."""
  computations: dict[str, list[Op]] = {}
  entry, current = "", None
  lines, inside = [], False
  for line in text.splitlines():
    # An instruction's attributes can run over several lines (a Pallas
    # kernel's `kernel_metadata` JSON): a line inside a computation that is
    # neither indented nor its closing brace continues the one before.
    if inside and line and not line[0].isspace() and line.rstrip() != "}":
      lines[-1] += line
      continue
    if not inside:
      inside = bool(_HEADER.match(line)) and line.rstrip().endswith("{")
    elif line.rstrip() == "}":
      inside = False
    lines.append(line)
  for line in lines:
    if current is None:
      m = _HEADER.match(line)
      if m and line.rstrip().endswith("{"):
        current = m.group(2)
        computations[current] = []
        if m.group(1):
          entry = current
      continue
    if line.startswith("}"):
      current = None
      continue
    op = _parse_op(line)
    if op is not None:
      computations[current].append(op)
  if not entry:
    raise ValueError("no ENTRY computation in the HLO text")
  return computations, entry


@dataclasses.dataclass
class Breakdown:
  """Bytes accessed per device by category (`CATEGORIES`), XLA's total, and
  the biggest operations (bytes, category split, `op opcode op_name`)."""

  bytes: dict[str, float]
  xla_total: float
  top: list[tuple[float, dict[str, float], str]]
  outside: dict[str, float] = dataclasses.field(default_factory=dict)
  # The same rules counting HBM only (`_array_bytes`' `hbm_only`), and not
  # the buffer an in-place update writes into (`_updated_in_place`): what
  # moves through the chip's memory bandwidth, the roofline's bytes.
  hbm: dict[str, float] = dataclasses.field(default_factory=dict)
  hbm_outside: dict[str, float] = dataclasses.field(default_factory=dict)
  # The costliest operations by those HBM rules.
  hbm_top: list[tuple[float, dict[str, float], str]] = dataclasses.field(
      default_factory=list
  )

  @property
  def total(self) -> float:
    return sum(self.bytes.values())

  @property
  def unexplained(self) -> float:
    """XLA's total less this accounting's (0 when XLA gave none)."""
    return self.xla_total - self.total if self.xla_total else 0.0

  def lines(self, prefix: str = "", scale: float = 1.0) -> list[str]:
    """`key=value` pairs, MiB (times `scale`, e.g. chips / tokens)."""
    mib = lambda b: f"{b * scale / 2**20:.2f}"
    pairs = [f"{prefix}{k}_mib={mib(self.bytes[k])}" for k in CATEGORIES]
    pairs.append(f"{prefix}total_mib={mib(self.total)}")
    pairs.append(f"{prefix}outside_loops_mib={mib(sum(self.outside.values()))}")
    pairs.append(f"{prefix}xla_total_mib={mib(self.xla_total)}")
    pairs.append(f"{prefix}unexplained_mib={mib(self.unexplained)}")
    if self.hbm:
      # The roofline's split: a fusion's operand counted as the slices it
      # takes, a buffer updated in place as its update, VMEM not at all.
      hbm = lambda k: mib(self.hbm.get(k, 0.0))
      pairs += [f"{prefix}hbm_{k}_mib={hbm(k)}" for k in CATEGORIES]
      outside = mib(sum(self.hbm_outside.values()))
      pairs.append(f"{prefix}hbm_outside_loops_mib={outside}")
    return pairs


class _Analysis:
  """The cost rules over one parsed module, with each buffer's kind."""

  def __init__(self, computations, entry, hbm_only=False):
    self.hbm_only = hbm_only
    self.comps = computations
    self.entry = entry
    self.defs = {
        c: {op.name: op for op in ops} for c, ops in computations.items()
    }
    self.bytes = dict.fromkeys(CATEGORIES, 0.0)
    self.outside = dict.fromkeys(CATEGORIES, 0.0)
    self.loops = 0  # while loops around the ops being costed
    self.scale = 1.0  # trips of the counted loops around them
    self.per_op: list[tuple[float, dict[str, float], str]] = []
    # Kind of each value, per computation: "weights", "cache", "state" or
    # None (computed here), element by element for tuples.
    self.kinds: dict[tuple[str, str], list[str | None]] = {}

  def _size(self, shape: str) -> float:
    return shape_bytes(shape, self.hbm_only)

  # -- kinds ------------------------------------------------------------------

  @staticmethod
  def _kind_of_name(op_name: str) -> str | None:
    if "cache" in op_name:
      return "cache"
    if op_name.startswith("p[") or op_name.startswith("params"):
      return "weights"
    if op_name:
      return "state"
    return None

  def kind(self, comp: str, name: str, index: int | None = None):
    ks = self.kinds.get((comp, name))
    if ks is None:
      return None
    if index is None:
      return ks[0] if len(ks) == 1 else None
    return ks[index] if index < len(ks) else None

  def _set_kinds(self, comp: str, op: Op, param_kinds) -> None:
    n = len(op.elements)
    ks: list[str | None] = [None] * n
    if op.opcode == "parameter":
      ks = list(param_kinds.get(op.name, [None] * n))
      if comp == self.entry:
        ks = [self._kind_of_name(op.op_name)] * n
    elif op.opcode in ("get-tuple-element",):
      i = int(re.search(r"index=(\d+)", op.attrs).group(1))
      ks = [self.kind(comp, op.operands[0], i)]
    elif op.opcode in (
        "bitcast",
        "copy",
        "copy-done",
        "reshape",
        "transpose",
        "opt-barrier",
        "custom-call",
        "convert",
        "all-gather",
        "all-gather-done",
    ):
      if op.operands:
        src = self.kinds.get((comp, op.operands[0]), [None])
        ks = src if len(src) == n else [src[0]] * n
    elif op.opcode == "copy-start":
      ks = [self.kind(comp, op.operands[0])] * n
    elif op.opcode == "tuple":
      ks = [self.kind(comp, o) for o in op.operands]
    elif op.opcode == "dynamic-update-slice":
      ks = [self.kind(comp, op.operands[0])]
    elif op.opcode in ("fusion",):
      ks = self._fusion_kinds(comp, op)
    elif op.opcode == "while":
      ks = list(self.kinds.get((comp, op.operands[0]), [None] * n))
    self.kinds[(comp, op.name)] = ks

  def _fusion_kinds(self, comp: str, op: Op) -> list[str | None]:
    """A fusion's results take the kind of the buffer each updates in place
    (a root dynamic-update-slice's operand 0, through the fused params)."""
    ops = self.defs[op.attr("calls")]
    root = next(o for o in ops.values() if o.root)
    outs = root.operands if root.opcode == "tuple" else [root.name]
    ks = [self._inplace_kind(comp, op, ops, out) for out in outs]
    return ks if len(ks) == len(op.elements) else [ks[0]] * len(op.elements)

  def _inplace_kind(self, comp, op, ops, name, depth=0):
    """The kind of the fusion `op`'s operand that its fused value `name`
    (in `ops`) updates in place, if any."""
    o = ops.get(name)
    if o is None or depth > 8:
      return None
    if o.opcode == "dynamic-update-slice" or o.opcode == "scatter":
      return self._inplace_kind(comp, op, ops, o.operands[0], depth + 1)
    if o.opcode in ("bitcast", "copy", "reshape"):
      return self._inplace_kind(comp, op, ops, o.operands[0], depth + 1)
    if o.opcode == "parameter":
      return self.kind(comp, op.operands[self._param_index(o)])
    if o.opcode == "fusion":
      inner = o.attr("calls")
      inner_ops = self.defs[inner]
      r = next(x for x in self.comps[inner] if x.root)
      if r.opcode in ("dynamic-update-slice", "scatter"):
        # Follow the inner fusion's updated operand back out.
        target = r.operands[0]
        t = inner_ops.get(target)
        while t is not None and t.opcode in ("bitcast", "copy", "reshape"):
          t = inner_ops.get(t.operands[0])
        if t is not None and t.opcode == "parameter":
          return self._inplace_kind(
              comp, op, ops, o.operands[self._param_index(t)], depth + 1
          )
    return None

  @staticmethod
  def _param_index(op: Op) -> int:
    return int(op.parameter_number)

  # -- costs ------------------------------------------------------------------

  def add(self, split: dict[str, float], label: str) -> None:
    split = {k: v * self.scale for k, v in split.items()}
    for k, v in split.items():
      self.bytes[k] += v
      if not self.loops:
        self.outside[k] += v
    self.per_op.append((sum(split.values()), split, label))

  def trip_count(self, comp: str, op: Op) -> int | None:
    """A counted loop's trips (its condition's root compares a carried
    counter with a constant, `LT`, and the counter starts at a constant),
    else None (the decode loop stops on its rows' state)."""
    cond = op.attr("condition")
    root = next((o for o in self.comps.get(cond, []) if o.root), None)
    if root is None or root.opcode != "compare" or len(root.operands) != 2:
      return None
    if "direction=LT" not in root.attrs:
      return None
    counter, bound = (self.defs[cond].get(n) for n in root.operands)
    if counter is None or bound is None or bound.opcode != "constant":
      return None
    m = re.search(r"\bindex=(\d+)", counter.attrs)
    init = self.defs[comp].get(op.operands[0])
    if counter.opcode != "get-tuple-element" or not m or init is None:
      return None
    if init.opcode != "tuple" or int(m.group(1)) >= len(init.operands):
      return None
    start = self.defs[comp].get(init.operands[int(m.group(1))])
    if start is None or start.opcode != "constant":
      return None
    try:
      return max(0, int(bound.args) - int(start.args))
    except ValueError:
      return None

  def read_category(self, comp: str, name: str) -> str:
    k = self.kind(comp, name)
    if k == "weights":
      return "weights"
    if k == "cache":
      return "cache_read"
    if k == "state":
      return "loop_state"
    return "other"

  def write_category(self, kind: str | None) -> str:
    if kind == "cache":
      return "cache_write"
    if kind == "state":
      return "loop_state"
    return "other"

  def run(self, comp: str, param_kinds=None) -> None:
    param_kinds = param_kinds or {}
    for op in self.comps[comp]:
      self._set_kinds(comp, op, param_kinds)
      self.cost(comp, op)

  def cost(self, comp: str, op: Op) -> None:
    label = f"{op.name} {op.opcode} {op.op_name}"
    oc = op.opcode
    if oc in _FREE:
      return
    if oc == "while":
      carried = self.kinds.get((comp, op.operands[0]))
      trips = self.trip_count(comp, op)
      saved = self.scale
      if trips is None:
        self.loops += 1
      else:
        self.scale *= trips
      for key in ("body", "condition"):
        sub = op.attr(key)
        params = [o for o in self.comps[sub] if o.opcode == "parameter"]
        self.run(sub, {p.name: carried for p in params})
      if trips is None:
        self.loops -= 1
      self.scale = saved
      # The carried tuple's kinds after the loop are those of the body's
      # root (the same buffers, updated in place).
      return
    if oc == "call" or oc == "async-start":
      sub = op.attr("to_apply") or op.attr("calls")
      if sub:
        pk = {}
        for p in self.comps[sub]:
          if p.opcode == "parameter":
            pk[p.name] = self.kinds.get(
                (comp, op.operands[self._param_index(p)]), [None]
            )
        self.run(sub, pk)
      return
    if oc == "conditional":
      subs = re.findall(r"%([\w.\-]+)", re.search(
          r"(branch_computations=\{[^}]*\}|true_computation=%[\w.\-]+,"
          r" false_computation=%[\w.\-]+)", op.attrs).group(1))  # fmt: skip
      best = None
      for sub in subs:
        saved, self.bytes = self.bytes, dict.fromkeys(CATEGORIES, 0.0)
        saved_ops = len(self.per_op)
        self.run(sub)
        got, self.bytes = self.bytes, saved
        del self.per_op[saved_ops:]
        if best is None or sum(got.values()) > sum(best.values()):
          best = got
      self.add(best or {}, label)
      return
    if oc in ("async-done", "async-update"):
      return
    if oc == "tuple":
      self.add({"loop_state": self._size(op.shape)}, label)
      return
    if oc == "fusion":
      self.add(self._fusion(comp, op), label)
      return
    split: dict[str, float] = {}

    def put(cat, b):
      split[cat] = split.get(cat, 0.0) + b

    out_kind = self.kind(comp, op.name)
    if oc in _MOVES:
      # An asynchronous copy's tuple is (destination, source, context): it
      # moves the buffer, counted once on each side of the pair.
      size = self._size(op.elements[0])
      src = self._shape(comp, op.operands[0])
      reads = self._size(_split_tuple(src)[0] if src.startswith("(") else src)
      cat = "copy"
      if self.hbm_only and reads and not size:
        # A prefetch into VMEM: its HBM traffic is the read of what it
        # fetches, the weights' or the cache's.
        read = self.read_category(comp, op.operands[0])
        cat = read if read in ("weights", "cache_read") else cat
      put(cat, size + reads)
    elif oc in ("slice", "dynamic-slice", "gather"):
      size = self._size(op.shape)
      cat = self.read_category(comp, op.operands[0])
      put("gather_scatter" if cat in ("other", "loop_state") else cat, size)
      put("gather_scatter", size)
      for o in op.operands[1:]:
        put("gather_scatter", self._size(self._shape(comp, o)))
    elif oc == "dynamic-update-slice":
      upd = self._size(self._shape(comp, op.operands[1]))
      cat = "cache_write" if out_kind == "cache" else "gather_scatter"
      put(cat, 2 * upd)  # the update read, then written in place
      for o in op.operands[2:]:
        put(cat, self._size(self._shape(comp, o)))
    elif oc == "scatter":
      upd = self._size(self._shape(comp, op.operands[-1]))
      cat = "cache_write" if out_kind == "cache" else "gather_scatter"
      put(cat, 3 * upd + self._size(self._shape(comp, op.operands[1])))
    elif oc == "custom-call" and "tpu_custom_call" not in op.attrs:
      # XLA counts a custom call's bytes as unknown (-1).
      return
    elif oc in ("all-gather", "all-gather-start"):
      put("all_gather", sum(self._size(s) for s in op.elements))
      for o in op.operands:
        put("all_gather", self._size(self._shape(comp, o)))
    elif oc == "all-reduce" or oc == "all-reduce-start":
      out = sum(self._size(s) for s in op.elements)
      put("other", out)
      for o in op.operands:
        put(self.read_category(comp, o), self._size(self._shape(comp, o)))
    else:
      put(self.write_category(out_kind), self._size(op.shape))
      for o in op.operands:
        put(self.read_category(comp, o), self._size(self._shape(comp, o)))
    self.add(split, label)

  def _shape(self, comp: str, name: str) -> str:
    op = self.defs[comp].get(name)
    return op.shape if op is not None else ""

  def _fusion(self, comp: str, op: Op) -> dict[str, float]:
    fused = op.attr("calls")
    ops = self.comps[fused]
    defs = self.defs[fused]
    root = next(o for o in ops if o.root)
    split: dict[str, float] = {}

    def put(cat, b):
      split[cat] = split.get(cat, 0.0) + b

    root_indexed = self._root_opcode(fused) in _INDEXED
    out_kinds = self.kinds.get((comp, op.name), [None])
    # A cache's in-place update: what it reads to write is the write's.
    indexed = "cache_write" if "cache" in out_kinds else "gather_scatter"
    elements = op.elements
    roots = root.operands if root.opcode == "tuple" else [root.name]
    for i, shape in enumerate(elements):
      r = defs.get(roots[i]) if i < len(roots) else None
      where = fused
      if r is not None and r.opcode == "fusion":
        # A fusion whose value is a fused fusion's: that one's root updates.
        where, r = self._root(r.attr("calls"))
      kind = out_kinds[i] if i < len(out_kinds) else None
      if (
          r is not None
          and r.opcode == "dynamic-update-slice"
          and (len(elements) == 1 or root.opcode == "tuple")
      ):
        size = self._size(self._shape(where, r.operands[1]))
        put("cache_write" if kind == "cache" else "gather_scatter", size)
        continue
      cat = self.write_category(kind)
      if root_indexed and cat == "other":
        cat = "gather_scatter"
      put(cat, self._size(shape))
    for p in ops:
      if p.opcode != "parameter":
        continue
      i = self._param_index(p)
      src = op.operands[i]
      if self.hbm_only and self._updated_in_place(fused, p.name):
        continue  # written where it lies: only the update moves
      # The TPU compiler's analysis counts a fusion's operands whole, even
      # those it only slices (measured: `tests/test_hlo_bytes.py`); from
      # HBM only the slices are read.
      size = self._size(p.shape)
      sliced = self._sliced_bytes(fused, p.name) if self.hbm_only else None
      if size and sliced is not None:
        size = min(size, sliced)
      cat = self.read_category(comp, src)
      if root_indexed and cat in ("other", "loop_state"):
        cat = indexed
      put(cat, size)
    return split

  def _users(self, fused: str, name: str) -> list[Op]:
    """The fused computation's operations that take `name`."""
    return [o for o in self.comps[fused] if name in o.operands]

  def _is_value(self, fused: str, name: str, depth: int = 0) -> bool:
    """Whether `name` is the fused computation's value: its root, a root
    tuple's element, or bitcast to one."""
    ops = self.comps[fused]
    root = next(o for o in ops if o.root)
    if root.name == name or (root.opcode == "tuple" and name in root.operands):
      return True
    users = self._users(fused, name)
    if depth > 8 or len(users) != 1 or users[0].opcode != "bitcast":
      return False
    return self._is_value(fused, users[0].name, depth + 1)

  def _updated_in_place(self, fused: str, name: str, depth: int = 0) -> bool:
    """Whether the fused parameter (or value) `name` is used only as the
    buffer a `dynamic-update-slice` that is the fusion's value updates
    (through bitcasts, or a nested fusion's own such parameter): the
    output shares its buffer, and the emitter writes the update there and
    reads nothing else of it. XLA's analysis still counts it read whole
    (`bytes`); HBM traffic (`hbm`) does not."""
    users = self._users(fused, name)
    if depth > 8 or len(users) != 1 or users[0].operands.count(name) != 1:
      return False
    u = users[0]
    if u.opcode == "bitcast":
      return self._updated_in_place(fused, u.name, depth + 1)
    if u.opcode == "dynamic-update-slice":
      return u.operands[0] == name and self._is_value(fused, u.name)
    if u.opcode == "fusion" and self._is_value(fused, u.name):
      return self._updated_in_place(*self._inner_param(u, name), depth + 1)
    return False

  def _inner_param(self, fusion: Op, name: str) -> tuple[str, str]:
    """(computation, parameter) that the nested `fusion`'s operand `name`
    is inside it."""
    inner = fusion.attr("calls")
    i = fusion.operands.index(name)
    param = next(
        o for o in self.comps[inner]
        if o.opcode == "parameter" and self._param_index(o) == i
    )  # fmt: skip
    return inner, param.name

  def _sliced_bytes(self, fused: str, name: str, depth: int = 0):
    """The bytes of the slices taken of the fused parameter (or value)
    `name` when `slice`, `dynamic-slice` and `gather` (through bitcasts
    and nested fusions) are its only uses, else None. A gather reads the
    rows it takes (an embedding lookup: the tokens' rows, not the table)."""
    users = self._users(fused, name)
    if depth > 8 or not users:
      return None
    total = 0.0
    for u in users:
      if u.opcode == "bitcast":
        got = self._sliced_bytes(fused, u.name, depth + 1)
      elif (
          u.opcode in ("slice", "dynamic-slice", "gather")
          and u.operands[0] == name
      ):
        # Whatever memory space the fused value's layout names: the
        # slice is read from the parameter's.
        got = None if name in u.operands[1:] else shape_bytes(u.shape)
      elif u.opcode == "fusion" and u.operands.count(name) == 1:
        # A nested fusion that slices its parameter (e.g. a prefix of the
        # cache's rows fused into a matmul's operand) reads what it takes.
        got = self._sliced_bytes(*self._inner_param(u, name), depth + 1)
      else:
        got = None
      if got is None:
        return None
      total += got
    return total

  def _root(self, fused: str) -> tuple[str, Op]:
    """(computation, root) of a fused computation, through fused fusions
    (a fusion whose root is a fusion has that fusion's root)."""
    root = next(o for o in self.comps[fused] if o.root)
    while root.opcode == "fusion":
      fused = root.attr("calls")
      root = next(o for o in self.comps[fused] if o.root)
    return fused, root

  def _root_opcode(self, fused: str) -> str:
    return self._root(fused)[1].opcode


def breakdown_text(
    text: str, xla_total: float = 0.0, top: int = 10
) -> Breakdown:
  """`Breakdown` of an HLO module's text (`compiled.as_text()`), with XLA's
  own total beside it and the `top` costliest operations."""
  computations, entry = parse(text)
  analysis = _Analysis(computations, entry)
  analysis.run(entry)
  hbm = _Analysis(computations, entry, hbm_only=True)
  hbm.run(entry)
  costliest = lambda a: sorted(a.per_op, key=lambda x: -x[0])[:top]
  return Breakdown(
      dict(analysis.bytes),
      xla_total,
      costliest(analysis),
      analysis.outside,
      dict(hbm.bytes),
      hbm.outside,
      costliest(hbm),
  )


def breakdown(compiled, top: int = 10) -> Breakdown:
  """`Breakdown` of a `jax.stages.Compiled` program (one device's bytes)."""
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  total = float((cost or {}).get("bytes accessed", 0.0))
  return breakdown_text(compiled.as_text(), total, top)
