r"""Compiles a config's TPU programs ahead of time on a CPU host: does it fit?

  python -m spade.compile --config=configs/gemma3_tpu.py:1b --topology=v5p-32
  python -m spade.compile --config=configs/tiny.py --topology=v5p-8 \
      --config.compile.agent_rows=64
  python -m spade.compile --config=configs/qwen3_4b_tpu.py --topology=v5p-32 \
      --noupdate --nosamplers   # the slot engine's programs only
  python -m spade.compile --config=configs/gemma3_tpu.py:12b \
      --topology=v5p-128 --noupdate --nosamplers --engine --roles=designer

For the named Cloud TPU slice (`spade.model.topology`: v5p-8, v5p-32, v5e-16,
v6e-8, ...) it builds the slice's device list with libtpu's topology
description (no chips needed: `pip install -e .[tpu]`), the mesh with
`spade.model.sharding.make_mesh`, and lowers and compiles, from abstract
`jax.ShapeDtypeStruct`s carrying their NamedShardings (no real arrays):

  update            the shared update step (`spade.train.update`) on the
                    worst-case agent and designer batches;
  {role} prefill    the lock-step sampler's prompt pass (the evaluation
                    responder's for the agent), `sampling.prefill_chunk`
                    columns at a time, which creates the KV cache one call
                    needs (prompt + new tokens);
  {role} decode     one decode step on that cache (donated, as in the loop).
  {role} slots prefill-insert, {role} slots generate
                    the slot engine's programs (`spade.sampling.slot_engine`,
                    what the loop samples with; `--noengine` skips them):
                    `sampling.prefill_rows` prompts written into
                    `sampling.slots` slots of a `model.max_len` cache, and
                    `sampling.decode_steps` tokens over every slot, each
                    on the engine's largest cache windows (the server's
                    window is static, one program each;
                    `--engine_windows`, default 2, 0 for all); for
                    generate also the bytes accessed per generated token
                    (`cost_analysis()`, one decode step) against the least
                    a step must read, the weights and every slot's cache
                    once (a `program=... bytes_per_token=... minimum=...
                    ratio=... hbm_bytes_per_token=... hbm_ratio=...` line:
                    XLA's count, then HBM traffic alone by
                    `spade.hlo_bytes`' rules, the roofline's figure;
                    `*_slots_bytes_ratio=`, `*_slots_hbm_ratio=` in the
                    last line);
  {role} slots generate on {r} rows
                    generate on each count of gathered live rows the server
                    can choose (`sampling.min_rows`, `SlotEngine.rows`),
                    which copy their rows' cache: each program's peak and
                    bytes (`*_rows{r}_bytes_ratio=`, `*_rows{r}_hbm_ratio=`;
                    `--noengine_gathered` skips them), and in the last
                    line each gathered program's step against the
                    every-slot one's (`*_rows{r}_step_vs_every_slot=`) and
                    the count up to which gathering reads less
                    (`*_gather_pays_up_to=`; `sampling.max_gathered_rows`);
                    with `--bytes_breakdown`, where each generate
                    program's bytes go (the gathered ones' too)
                    (`spade.hlo_bytes`: weights, cache reads and writes,
                    copies, gathers, loop state, other; one `key=value`
                    line, then the costliest operations).

Per program it prints the per-device argument / output / temporary / peak
memory (`memory_analysis()`) against the chip's HBM, and for the samplers
what stays in HBM beside them while they run (counted from the shapes, not
compiled): the optimizer state. A program fits when its peak plus that is
within HBM. Then the model FLOPs of one
call counted from the shapes (matmuls and attention; XLA's own
`cost_analysis()` figure is printed beside it, but it counts a loop body
once, so scanned layers and micro-batches make it a fraction of the real
work), the time that call takes at the chips' peak bfloat16 rate (a bound:
MFU = that time / the measured time), and the compile time. The last line is
`key=value` pairs (`peak_gib_per_device=`, `hbm_gib=`, `fits=`, ...); the
exit status is 1 when a program does not fit (the compiler's
RESOURCE_EXHAUSTED, or a peak above HBM).

Shapes default to the config's worst case, rounded as
`spade.selfplay.batching.make_batch` and the engine's sampler round them:
update agent rows = every episode's every turn, `model.max_len` tokens;
designer rows = `designer.num_envs`, prompt + program tokens; an agent
sampler call holds `eval.batch_size` prompts (the evaluation responder's
call). `config.compile.*` overrides the update's
batch (the TPU configs set the reference's rollout size there).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import sys
import time
from typing import Any, Sequence

# Several processes (pytest -n 2) may load libtpu at once; libtpu refuses a
# second loader unless told this. The worker hostname silences libtpu's
# warnings about the TPU VM metadata it cannot find on a CPU host.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from ml_collections import config_flags

from spade import config as config_lib
from spade import hlo_bytes
from spade.model import architecture
from spade.model import sharding
from spade.model import topology as topology_lib
from spade.model import transformer
from spade.sampling import sampler as sampler_lib
from spade.sampling import shapes as shapes_lib
from spade.sampling import slot_engine as slot_engine_lib
from spade.sampling import slot_server as slot_server_lib
from spade.train import state as state_lib
from spade.train import update as update_lib

# pylint: enable=g-import-not-at-top,wrong-import-position

GIB = 1024**3


@dataclasses.dataclass
class Program:
  """What compiling one program told us (memory in bytes per device).

  Attributes:
    name: "update", "agent prefill", ...
    shape: the shapes it was compiled for, in words.
    fits: compiled and its peak is within HBM.
    error: the compiler's message when it did not compile (out of memory).
    argument_bytes: inputs per device.
    output_bytes: outputs per device.
    alias_bytes: outputs written in place of donated inputs.
    temp_bytes: scratch per device.
    peak_bytes: peak per device (the compiler's figure, else args + outputs
      - aliased + temporaries).
    held_bytes: what else stays in HBM per device while it runs (samplers:
      the optimizer state and the rollout's kept caches), from the shapes.
    held: what `held_bytes` is, in words.
    model_flops: FLOPs of one call, all devices, counted from the shapes.
    xla_flops: `cost_analysis()` FLOPs per device (loop bodies once).
    compile_s: seconds to lower and compile.
    bytes_per_token: slot generate: `cost_analysis()` bytes accessed per
      generated token (a decode step over every slot, all devices).
    min_bytes_per_token: the least a step must read per token: parameters
      and the live cache, once.
    breakdown: slot generate: where its bytes go
      (`spade.hlo_bytes.Breakdown`, per device, one decode step).
    rows: slot generate: the rows a step decodes (every slot, or the
      gathered live rows of `SlotEngine.rows`): tokens a step.
    step_hbm_bytes: slot generate: a step's HBM bytes per device
      (`per_step_bytes`: what runs once a call spread over its steps), all
      its rows' tokens.
    hbm_bytes_per_token: slot generate: the same per generated token (all
      devices): what the roofline's minimum is held against.
  """

  name: str
  shape: str
  fits: bool = False
  error: str = ""
  argument_bytes: int = 0
  output_bytes: int = 0
  alias_bytes: int = 0
  temp_bytes: int = 0
  peak_bytes: int = 0
  held_bytes: int = 0
  held: str = ""
  model_flops: float = 0.0
  xla_flops: float = 0.0
  compile_s: float = 0.0
  bytes_per_token: float = 0.0
  min_bytes_per_token: float = 0.0
  breakdown: hlo_bytes.Breakdown | None = None
  rows: int = 0
  step_hbm_bytes: float = 0.0
  hbm_bytes_per_token: float = 0.0

  @property
  def key(self) -> str:
    """The prefix of its summary keys: "agent_slots" for the program over
    every slot, "agent_rows64" over 64 gathered rows."""
    role = self.name.split()[0]
    if self.name.endswith(" in place"):
      return f"{role}_rows{self.rows}_in_place"
    if " on " in self.name:
      return f"{role}_rows{self.rows}"
    return f"{role}_slots"

  @property
  def bytes_ratio(self) -> float:
    """Bytes accessed per generated token over the minimum (0: unknown)."""
    if not self.min_bytes_per_token:
      return 0.0
    return self.bytes_per_token / self.min_bytes_per_token

  @property
  def hbm_ratio(self) -> float:
    """HBM bytes per generated token over the minimum (0: unknown)."""
    if not self.min_bytes_per_token:
      return 0.0
    return self.hbm_bytes_per_token / self.min_bytes_per_token


@dataclasses.dataclass
class Report:
  """All programs of one config on one slice."""

  config_name: str
  slice: topology_lib.Slice
  mesh_shape: dict[str, int]
  programs: list[Program]

  @property
  def fits(self) -> bool:
    """Every program compiled and fits the chip's HBM."""
    return all(p.fits for p in self.programs)

  @property
  def peak_bytes(self) -> int:
    """The largest per-device peak over the programs (with what each holds
    beside it)."""
    return max((p.peak_bytes + p.held_bytes for p in self.programs), default=0)

  def summary(self) -> str:
    """The last line: space-separated key=value pairs."""
    update = next((p for p in self.programs if p.name == "update"), None)
    chips_peak = self.slice.chips * self.slice.peak_bf16_flops
    pairs = {
        "config": self.config_name,
        "topology": self.slice.name,
        "chips": self.slice.chips,
        "mesh": "x".join(str(v) for v in self.mesh_shape.values()),
        "peak_gib_per_device": f"{self.peak_bytes / GIB:.2f}",
        "hbm_gib": f"{self.slice.hbm_gib:g}",
        "fits": self.fits,
        "compile_s": f"{sum(p.compile_s for p in self.programs):.1f}",
    }
    for p in self.programs:
      if p.bytes_per_token:
        pairs[f"{p.key}_bytes_per_token_mib"] = (
            f"{p.bytes_per_token / 2**20:.2f}"
        )
        pairs[f"{p.key}_bytes_ratio"] = f"{p.bytes_ratio:.2f}"
      if p.hbm_bytes_per_token:
        pairs[f"{p.key}_hbm_ratio"] = f"{p.hbm_ratio:.2f}"
    pairs.update(gather_pairs(self.programs))
    pairs.update(called_ratio_pairs(self.programs))
    if update is not None:
      pairs["update_peak_gib"] = f"{update.peak_bytes / GIB:.2f}"
      pairs["update_tflop"] = f"{update.model_flops / 1e12:.1f}"
      pairs["update_s_at_peak"] = f"{update.model_flops / chips_peak:.3f}"
      pairs["update_compile_s"] = f"{update.compile_s:.1f}"
    return " ".join(f"{k}={v}" for k, v in pairs.items())


def called_ratio_pairs(programs: Sequence[Program]) -> dict[str, str]:
  """Per role, the highest `hbm_ratio` over the generate programs the
  server calls (`<role>_hbm_ratio_max`): the one on every slot and each
  gathered count's, in place when the engine runs gathered calls so (the
  taken rows' programs on the whole cache are then compiled beside them
  for comparison only), else on taken rows: the figure the decode
  roofline's target (`hbm_ratio` <= 1.3, docs/scale.md) is held to."""
  pairs = {}
  for role in sorted({p.name.split()[0] for p in programs}):
    generate = [
        p for p in programs if p.name.split()[0] == role and p.hbm_ratio
    ]
    in_place = any(p.key.endswith("_in_place") for p in generate)
    called = [
        p for p in generate
        if p.key == f"{role}_slots" or p.key.endswith("_in_place") == in_place
    ]  # fmt: skip
    if called:
      ratio = max(p.hbm_ratio for p in called)
      pairs[f"{role}_hbm_ratio_max"] = f"{ratio:.2f}"
  return pairs


def gather_pairs(programs: Sequence[Program]) -> dict[str, str]:
  """Whether gathering rows pays, from the breakdowns: per gathered
  generate program, a step's HBM bytes per device over the every-slot
  program's (`<role>_rows<r>_step_vs_every_slot`: under 1, the call on r
  rows reads less a step than one on every slot), and per role the largest
  count up to which every gathered count reads less
  (`<role>_gather_pays_up_to`, 0: none does; `sampling.max_gathered_rows`
  caps the counts the server uses)."""
  pairs = {}
  for role in sorted({p.name.split()[0] for p in programs}):
    every = next(
        (p for p in programs if p.key == f"{role}_slots" and p.step_hbm_bytes),
        None,
    )
    gathered = sorted(
        (p for p in programs
         if p.key.startswith(f"{role}_rows") and p.step_hbm_bytes),
        key=lambda p: p.rows,
    )  # fmt: skip
    if every is None or not gathered:
      continue
    # The server's gathered calls on the whole cache: in place when the
    # engine runs them so (they were compiled), else on taken rows.
    in_place = any(p.key.endswith("_in_place") for p in gathered)
    pays, paying = 0, True
    for p in gathered:  # smallest first
      ratio = p.step_hbm_bytes / every.step_hbm_bytes
      pairs[f"{p.key}_step_vs_every_slot"] = f"{ratio:.2f}"
      if p.key.endswith("_in_place") != in_place:
        continue
      paying = paying and ratio < 1  # and every smaller count pays too
      if paying:
        pays = p.rows
    pairs[f"{role}_gather_pays_up_to"] = str(pays)
  return pairs


# -- shapes -------------------------------------------------------------------


def _rows(n: int, shards: int) -> int:
  """`make_batch`'s row rounding: a power of two, then a multiple of shards."""
  size = 1
  while size < max(n, shards, 1):
    size *= 2
  return -(-size // shards) * shards


def _length(n: int, max_len: int, minimum: int = 64, step: int = 256) -> int:
  """`make_batch`'s length bucket (powers of two to 256, then multiples)."""
  size = minimum
  while size < n and size < step:
    size *= 2
  if size < n:
    size = -(-n // step) * step
  return min(size, max_len)


def update_shapes(config, shards: int) -> dict[str, tuple[int, int]]:
  """(rows, length) of the update's agent and designer sub-batches.

  `config.compile.*` when set (> 0), else the config's worst case: every turn
  of every trained episode at `model.max_len` tokens, and one row per
  designed environment at prompt + program tokens.
  """
  c = config
  episodes = c.designer.num_envs * c.agent.episodes_per_env
  if c.agent.train_on_hinted:
    episodes *= 2
  agent_rows = c.compile.agent_rows or episodes * c.agent.max_turns
  agent_len = c.compile.agent_len or c.model.max_len
  designer_rows = c.compile.designer_rows or c.designer.num_envs
  designer_len = c.compile.designer_len or _length(
      c.designer.max_prompt_tokens + c.designer.max_new_tokens, c.model.max_len
  )
  multiple = math.lcm(shards, c.optim.num_minibatches)
  return {
      "agent": (_rows(agent_rows, multiple), agent_len),
      "designer": (_rows(designer_rows, multiple), designer_len),
  }


def sampler_shapes(config, shards: int) -> dict[str, tuple[int, int, int]]:
  """(rows, prompt length, new tokens) of each role's lock-step call.

  As `spade.sampling.text.TextGenerator` pads them: rows to a power of two
  and a multiple of the batch shards, prompts to a power-of-two bucket of
  at most `max_len - new` tokens. Agent: one call of the evaluation
  responder (`eval.batch_size` prompts; the loop's rollout samples through
  the slot engine, `compile_engine`); designer: every design in one call.
  """
  c = config
  out = {}
  for role, rows, prompt, new in (
      (
          "agent",
          c.eval.batch_size,
          c.agent.max_context,
          c.eval.max_new_tokens or c.agent.max_new_tokens,
      ),
      (
          "designer",
          c.designer.num_envs,
          c.designer.max_prompt_tokens,
          c.designer.max_new_tokens,
      ),
  ):
    prompt = sampler_lib.bucket(max(1, min(prompt, c.model.max_len - new)))
    out[role] = (_rows(rows, shards), prompt, new)
  return out


# -- FLOPs --------------------------------------------------------------------


def _layer_matmul_params(cfg: architecture.ModelConfig) -> int:
  d, hd = cfg.embed_dim, cfg.head_dim
  attn = d * cfg.num_heads * hd * 2 + d * cfg.num_kv_heads * hd * 2
  return attn + 3 * d * cfg.mlp_dim  # gated MLP: gate, up, down


def _causal_context(length: int, window: int) -> int:
  """Sum over positions of the keys each attends to (causal, windowed)."""
  if length <= window:
    return length * (length + 1) // 2
  return window * (window + 1) // 2 + (length - window) * window


def forward_flops(model_config, rows: int, length: int, logits: str) -> float:
  """FLOPs of a causal forward over [rows, length] tokens.

  Args:
    model_config: `config.model`.
    rows: sequences.
    length: tokens each.
    logits: "all" (training: every position) or "last" (prefill).
  """
  cfg = architecture.ModelConfig.from_config(model_config)
  per_token = cfg.num_layers * _layer_matmul_params(cfg)
  flops = 2.0 * rows * length * per_token
  for i in range(cfg.num_layers):
    window = length if cfg.is_global(i) else cfg.window(i)
    # QK^T and AV: 2 matmuls x 2 FLOPs per multiply-add.
    flops += (
        4.0 * rows * cfg.num_heads * cfg.head_dim
        * _causal_context(length, window)
    )  # fmt: skip
  positions = length if logits == "all" else 1
  return flops + 2.0 * rows * positions * cfg.embed_dim * cfg.vocab_size


def decode_flops(model_config, rows: int, cache_len: int) -> float:
  """FLOPs of one decode step of `rows` sequences with `cache_len` keys."""
  cfg = architecture.ModelConfig.from_config(model_config)
  flops = 2.0 * rows * cfg.num_layers * _layer_matmul_params(cfg)
  for i in range(cfg.num_layers):
    keys = cache_len if cfg.is_global(i) else min(cfg.window(i), cache_len)
    flops += 4.0 * rows * cfg.num_heads * cfg.head_dim * keys
  return flops + 2.0 * rows * cfg.embed_dim * cfg.vocab_size


def update_flops(config, shapes: dict[str, tuple[int, int]]) -> float:
  """Forward + backward (3 forwards) per epoch, plus the KL reference pass."""
  passes = 3 + (1 if state_lib.keeps_reference(config) else 0)
  total = sum(
      forward_flops(config.model, rows, length, "all")
      for rows, length in shapes.values()
  )
  return passes * total * config.optim.epochs


# -- compiling ----------------------------------------------------------------


def _abstract(tree, shardings):
  return jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      tree,
      shardings,
  )


def abstract_state(config, mesh, rules, optimizer) -> state_lib.TrainState:
  """The step-0 train state as ShapeDtypeStructs with their shardings."""

  def make(rng):
    params = transformer.init_params(config.model, rng)
    return state_lib.create_train_state(
        params,
        optimizer,
        rng,
        keep_reference=state_lib.keeps_reference(config),
        lora_rank=config.optim.lora_rank,
    )

  shapes = jax.eval_shape(make, jax.random.PRNGKey(0))
  return _abstract(shapes, state_lib.state_shardings(shapes, mesh, rules))


def _memory(program: Program, compiled, hbm_bytes: float) -> None:
  stats = compiled.memory_analysis()
  program.argument_bytes = int(stats.argument_size_in_bytes)
  program.output_bytes = int(stats.output_size_in_bytes)
  program.alias_bytes = int(stats.alias_size_in_bytes)
  program.temp_bytes = int(stats.temp_size_in_bytes)
  peak = int(getattr(stats, "peak_memory_in_bytes", 0) or 0)
  if peak <= 0:
    peak = (
        program.argument_bytes
        + program.output_bytes
        - program.alias_bytes
        + program.temp_bytes
    )
  program.peak_bytes = peak
  program.fits = peak + program.held_bytes <= hbm_bytes
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  program.xla_flops = float((cost or {}).get("flops", 0.0))


def _compile(program: Program, lower, hbm_bytes: float):
  """Lowers and compiles; an out-of-memory compile is a result, not a crash.

  Returns:
    (program with its figures filled in, the `Lowered` object, the
    `Compiled` one or None when it did not compile).
  """
  start = time.perf_counter()
  lowered = lower()
  try:
    compiled = lowered.compile()
  except jax.errors.JaxRuntimeError as e:
    if "RESOURCE_EXHAUSTED" not in str(e):
      raise
    program.error = str(e).strip().splitlines()[0][:500]
    program.fits = False
    compiled = None
  else:
    _memory(program, compiled, hbm_bytes)
  program.compile_s = time.perf_counter() - start
  return program, lowered, compiled


def _batch(rows: int, length: int, sh) -> dict[str, jax.ShapeDtypeStruct]:
  def sds(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sh)

  grid = (rows, length)
  return {
      "tokens": sds(grid, jnp.int32),
      "positions": sds(grid, jnp.int32),
      "input_mask": sds(grid, jnp.bool_),
      "loss_mask": sds(grid, jnp.bool_),
      "old_logprobs": sds(grid, jnp.float32),
      "advantages": sds((rows,), jnp.float32),
      "weights": sds((rows,), jnp.float32),
  }


def compile_update(config, mesh, rules, state, optimizer, hbm_bytes):
  """The update step of `spade.train.update.make_update_step`, compiled."""
  shards = mesh.shape["data"] * mesh.shape["fsdp"]
  shapes = update_shapes(config, shards)
  model = transformer.build_model(config.model)
  update_fn = update_lib.make_update_step(model, optimizer, mesh, config)
  batch = {
      role: _batch(rows, length, update_fn.batch_sharding)
      for role, (rows, length) in shapes.items()
  }

  def lower():
    return update_fn.lower(state, batch)

  program = Program(
      "update",
      ", ".join(f"{r} {n}x{t}" for r, (n, t) in shapes.items())
      + f", microbatch_rows={config.optim.microbatch_rows}"
      + f", remat={config.model.remat}",
      model_flops=update_flops(config, shapes),
  )
  return _compile(program, lower, hbm_bytes)[0]


def device_bytes(tree) -> int:
  """Bytes one device holds of a tree of sharded abstract arrays."""
  return sum(
      math.prod(x.sharding.shard_shape(x.shape)) * jnp.dtype(x.dtype).itemsize
      for x in jax.tree.leaves(tree)
  )


def global_bytes(tree) -> int:
  """Bytes of a tree of arrays counted once, however many devices hold
  each piece."""
  return sum(
      math.prod(x.shape) * jnp.dtype(x.dtype).itemsize
      for x in jax.tree.leaves(tree)
  )


def compile_sampler(config, mesh, rules, state, role, hbm_bytes):
  """The role's prefill and one decode step, with the rollout's KV cache.

  `state` is the abstract train state: the sampler runs on its params while
  the rest of it (optimizer state, ...) stays in HBM.
  """
  shards = mesh.shape["data"] * mesh.shape["fsdp"]
  rows, prompt, new = sampler_shapes(config, shards)[role]
  fns = transformer.sampling_fns(config.model, transformer.Role.of(role))
  grid = sharding.batch_sharding(mesh, rules, 2)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  params = state.params

  # The sampler's own prefill: `prefill_chunk` prompt columns at a time.
  sampler = sampler_lib.Sampler(
      *fns,
      pad_id=0,
      mesh=mesh,
      rules=rules,
      prefill_chunk=config.sampling.prefill_chunk,
  )
  state_bytes = device_bytes(
      (state.opt_state, state.ref_params, state.adapters)
  )

  def prefill(params, prompts, positions, input_mask):
    # As in the sampler: the decoding layout is made once per call, so the
    # prefill's peak holds both the given and the prepared parameters.
    params = fns.prepare_params(params)
    cache = fns.init_cache(rows, prompt + new)
    logits, cache = sampler.prefill(
        params, prompts, positions, input_mask, cache
    )
    return logits, cache, params

  def decode(params, last, positions, cache, index):
    mask = jnp.ones(last.shape, bool)
    return fns.tokens_to_logits(params, last, positions, mask, cache, index)

  def ints(shape, dtype=jnp.int32):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=grid)

  prefill_args = (
      params,
      ints((rows, prompt)),
      ints((rows, prompt)),
      ints((rows, prompt), jnp.bool_),
  )

  def lower_prefill():
    with sharding.use_rules(mesh, rules):
      return jax.jit(prefill).lower(*prefill_args)

  # What stays in HBM beside the sampler: the optimizer state.
  held_bytes = state_bytes
  held = f"optimizer state {state_bytes / GIB:.2f}"

  first, lowered, compiled = _compile(
      Program(
          f"{role} prefill",
          f"{rows}x{prompt} prompt, cache {prompt + new}",
          held_bytes=held_bytes,
          held=held,
          model_flops=forward_flops(config.model, rows, prompt, "last"),
      ),
      lower_prefill,
      hbm_bytes,
  )
  programs = [first]

  # The decode step takes the cache and parameters as the compiled prefill
  # leaves them (layout and shardings; the lowered program does not know
  # them yet), and donates the cache, as the sampler's loop updates it in
  # place. A prefill that did not compile leaves the parameters in their
  # shards and the cache's to the compiler.
  def like(info, shardings):
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        info,
        shardings,
    )

  _, cache_info, params_info = lowered.out_info
  if compiled is not None:
    _, cache_at, params_at = compiled.output_shardings
    cache = like(cache_info, cache_at)
  else:
    cache = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), cache_info
    )
    params_at = sharding.fitted_param_shardings(params_info, mesh, rules)
  prepared = like(params_info, params_at)

  def lower_decode():
    with sharding.use_rules(mesh, rules):
      return jax.jit(decode, donate_argnums=(3,)).lower(
          prepared,
          ints((rows, 1)),
          ints((rows, 1)),
          cache,
          jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated),
      )

  programs.append(
      _compile(
          Program(
              f"{role} decode",
              f"{rows} rows, cache {prompt + new}, x{new} steps",
              held_bytes=held_bytes,
              held=held,
              model_flops=decode_flops(config.model, rows, prompt + new),
          ),
          lower_decode,
          hbm_bytes,
      )[0]
  )
  return programs


class _Captured(Exception):
  """Raised by a stand-in program once it has its arguments."""


def slot_engine(config, mesh, rules, role: str, **overrides):
  """The role's slot engine as the loop builds it
  (`spade.selfplay.engine.Engine.slot_engine`); without a mesh, on one
  device. `overrides`: `SlotEngine` arguments set otherwise (the roofline
  benchmark's slot count, no stop ids)."""
  shards = 1 if mesh is None else mesh.shape["data"] * mesh.shape["fsdp"]
  c = config
  section = c.designer if role == "designer" else c.agent
  fns = transformer.sampling_fns(c.model, transformer.Role.of(role))
  options = dict(
      pad_id=0,
      stop_ids=(1,),
      slots=shapes_lib.round_up(c.sampling.slots, shards),
      cache_length=c.model.max_len,
      prefill_rows=shapes_lib.round_up(c.sampling.prefill_rows, shards),
      **config_lib.slot_engine_options(c.sampling),
      temperature=section.temperature,
      top_k=section.top_k,
      top_p=section.top_p,
      mesh=mesh,
      rules=rules,
  )
  options.update(overrides)
  return slot_engine_lib.SlotEngine(
      fns.tokens_to_logits, fns.init_cache, fns.prepare_params, **options
  )


def _engine_host_args(engine, params, decode_state, prompt: int, new: int):
  """The host arguments the `SlotServer` gives its prefill-insert (one
  fresh prompt of `prompt` tokens) and generate programs, captured by
  running the server's own host code against stand-ins (so they follow
  whatever the engine's programs take)."""
  captured = {}

  def stand_in(name, fn):
    def program(params_, state_, *args):
      del params_, state_
      captured[name] = args
      if name == "generate":
        raise _Captured()
      # What the program would return, every flag set: a live first token,
      # so the server goes on to generate.
      # Prefill-insert's last argument, the window, is static.
      *traced, window = args
      with sharding.use_rules(engine.mesh, engine.rules):
        _, out = jax.eval_shape(
            lambda p, st, *a: fn(p, st, *a, window),
            params, decode_state, *traced,
        )  # fmt: skip
      return "state", jax.tree.map(lambda x: np.ones(x.shape, x.dtype), out)

    return program

  programs = slot_engine_lib.Programs(
      init=lambda: None,
      prepare=lambda p: p,
      prefill_insert=stand_in("prefill_insert", engine.prefill_insert),
      generate=stand_in("generate", engine.generate),
  )
  server = slot_server_lib.SlotServer(engine, None, programs=programs)
  server.submit(
      slot_server_lib.Request(0, [2] * prompt, max(new, 2), jax.random.key(0))
  )
  try:
    server.step()
  except _Captured:
    pass
  return captured["prefill_insert"], captured["generate"]


def compile_engine(
    config,
    mesh,
    rules,
    state,
    role,
    hbm_bytes,
    windows=2,
    gathered=True,
    hlo_dir="",
):
  """The role's slot-engine programs (`spade.sampling.slot_engine`):
  prefill-insert and generate over `sampling.slots` slots of a
  `model.max_len` cache.

  The server runs each program on one of the engine's cache windows
  (`SlotEngine.windows`), a static argument: one program per window. This
  compiles the `windows` largest (0: every one) and reports, per program,
  the worst of them. A window's buffers (the rows' fresh cache, the
  generate loop's view of every slot) grow with it, so the peak is at the
  whole cache or the largest window below it (the default two): on
  `tests/test_compile.py`'s tiny shapes, all five windows compiled, it was
  the whole cache's for prefill-insert and the largest window's for
  generate (which takes a copy of its window; the whole cache does not).

  Besides memory and FLOPs, the whole-cache generate program's
  `cost_analysis()` bytes accessed (a while loop's body counted once: about
  one decode step) per generated token, against the minimum a step must
  read: the parameters and every slot's cache, once; and those bytes by
  category, HBM's among them (`spade.hlo_bytes`). With `hlo_dir`, each
  generate program's compiled HLO is written there
  (`<program key>.hlo.txt`), for `spade.hlo_bytes` or a reader.
  """
  engine = slot_engine(config, mesh, rules, role)
  s, c, n = engine.slots, engine.cache_length, engine.decode_steps
  every = engine.windows
  picked = every if windows <= 0 else every[-windows:]
  prompt, new = (
      (config.agent.max_context, config.agent.max_new_tokens)
      if role == "agent"
      else (config.designer.max_prompt_tokens, config.designer.max_new_tokens)
  )
  new = max(1, min(new, c - 1))
  prompt = max(1, min(prompt, c - new))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  fns = transformer.sampling_fns(config.model, transformer.Role.of(role))
  params_info = jax.eval_shape(fns.prepare_params or (lambda p: p),
                               state.params)  # fmt: skip
  params = _abstract(
      params_info, sharding.fitted_param_shardings(params_info, mesh, rules)
  )
  with sharding.use_rules(mesh, rules):
    init = jax.jit(engine.init).lower().compile()
  decode_state = _abstract(jax.eval_shape(engine.init), init.output_shardings)
  out = init.output_shardings
  prefill_args, generate_args = _engine_host_args(
      engine, params, decode_state, prompt, new
  )
  # Generate on every slot, then on each count of gathered live rows the
  # server can choose (`SlotEngine.rows`, from `sampling.min_rows`): those
  # run fewer rows but take a copy of their rows' cache, so their peak is
  # not bounded by the whole batch's.
  generate_args = generate_args[:4] + (None,)
  sh = engine.batch_shards

  def host(tree):
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(
            np.shape(x), np.asarray(x).dtype, sharding=replicated
        ),
        tree,
    )

  def lower(fn, args, at, window):
    # The server's call with its window (argument `at`) static, as it runs.
    rest = args[:at] + args[at + 1 :]

    def on_window(p, st, *a):
      return fn(p, st, *a[:at], window, *a[at:])

    def go():
      with sharding.use_rules(mesh, rules):
        return jax.jit(
            on_window, donate_argnums=1, out_shardings=(out, None)
        ).lower(params, decode_state, *host(rest))

    return go

  # What stays in HBM beside the engine: the optimizer state. The train
  # state's own (stacked) parameters do not: `selfplay.engine.Engine`
  # holds them in the decoding layout while it samples (`decode_params`),
  # and the programs' arguments count that copy.
  held_bytes = device_bytes((state.opt_state, state.ref_params, state.adapters))
  held = f"optimizer state {held_bytes / GIB:.2f}"
  # Every slot's cache read once, spread over the chips: a leaf the mesh
  # copies (the cache is split over the batch axes only, so with a tensor
  # axis each of its chips holds every KV head of its rows, and reads
  # them) is one read's worth, not one a copy.
  cache_bytes = global_bytes(decode_state["cache"]) / mesh.devices.size
  ws = ", ".join(f"{w:,}" for w in picked)
  on = f"windows {ws} of {len(every)}"

  def worst(name, shape, flops, fn, args, at, windows=picked):
    """Each of `windows`' program; the one with the highest peak (or the
    first that does not fit), its compile time the sum, and the
    whole-cache one's `Compiled` (every program is compiled on it)."""
    results = []
    for w in windows:
      p = Program(
          name, shape, held_bytes=held_bytes, held=held, model_flops=flops
      )
      results.append(_compile(p, lower(fn, args, at, w), hbm_bytes))
    failed = [p for p, _, _ in results if p.error]
    program = (
        failed[0]
        if failed
        else max((p for p, _, _ in results), key=lambda p: p.peak_bytes)
    )
    program.compile_s = sum(p.compile_s for p, _, _ in results)
    return program, results[-1][2]

  rows = engine.prefill_rows
  prefill, _ = worst(
      f"{role} slots prefill-insert",
      f"{rows} rows into {s} slots x cache {c}, chunk {engine.chunk}, {on}",
      forward_flops(config.model, rows, prompt, "last"),
      engine.prefill_insert, prefill_args, 2,
  )  # fmt: skip
  compiled_programs = [prefill]
  # Each gathered count on the rows an index names (taken out and put
  # back) and, with `sampling.in_place`, on each shard's first rows where
  # they lie (`generate`'s prefix): the server's calls on the whole cache
  # are those then (it moves the live slots there first; the taken rows'
  # program on the whole cache is compiled beside it, for comparison).
  calls = [(s, 0)] + [
      (r, p) for r in reversed(engine.rows[:-1])
      for p in ((0, r) if engine.runs_in_place else (0,))
  ] * bool(gathered)  # fmt: skip
  for r, prefix in calls:
    args, fn, windows = generate_args, engine.generate, picked
    name = f"{role} slots generate"
    if prefix:
      fn, windows = functools.partial(engine.generate, prefix=r), (c,)
      name += f" on {r} rows in place"
    elif r < s:
      args = generate_args[:4] + (np.zeros((sh, r // sh), np.int32),)
      name += f" on {r} rows"
    ws = ", ".join(f"{w:,}" for w in windows)
    shape = f"windows {ws} of {len(every)}"
    program, compiled = worst(
        name,
        f"{s} slots x cache {c}, {n} steps a call, {shape}",
        n * decode_flops(config.model, r, c),
        fn, args, 3, windows,
    )  # fmt: skip
    compiled_programs.append(program)
    if compiled is None:
      continue
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
      cost = cost[0] if cost else {}
    chips = mesh.devices.size
    step = float((cost or {}).get("bytes accessed", 0.0))
    # The least a step must read, per device: the weights once a data
    # replica (each reads its own copy; a leaf the other axes copy is one
    # read's worth, as for the cache) and its rows' caches once; of the
    # input embedding only its tokens' rows (a few KiB), not the table (a
    # gather reads what it takes: `hlo_bytes._sliced_bytes`).
    lookup = global_bytes(params.get("embedder", {}))
    weights = (global_bytes(params) - lookup) * int(mesh.shape["data"])
    floor = weights / chips + cache_bytes * r / s
    # Per device a step reads its shards; the slice makes `r` tokens a step.
    program.rows = r
    program.bytes_per_token = step * chips / r
    program.min_bytes_per_token = floor * chips / r
    # HBM traffic by `spade.hlo_bytes`' rules (under a second a program);
    # `breakdown` only prints it. The module's text is taken once, for the
    # rules and for `hlo_dir`.
    text = compiled.as_text()
    program.breakdown = hlo_bytes.breakdown_text(text, step)
    program.step_hbm_bytes = per_step_bytes(program.breakdown, n)[1]
    program.hbm_bytes_per_token = program.step_hbm_bytes * chips / r
    if hlo_dir:
      os.makedirs(hlo_dir, exist_ok=True)
      path = os.path.join(hlo_dir, f"{program.key}.hlo.txt")
      with open(path, "w") as f:
        f.write(text)
  if gathered and engine.runs_in_place and len(engine.rows) > 1:
    # The server's move of live slots to the front of their shards (before
    # a call in place): two slots a shard swapped, every cache row of them.
    def swap():
      with sharding.use_rules(mesh, rules):
        return jax.jit(engine.swap, donate_argnums=0, out_shardings=out).lower(
            decode_state, *host((np.zeros((sh, 2), np.int32),))
        )

    program = Program(
        f"{role} slots swap", f"2 of each shard's {s // sh} slots",
        held_bytes=held_bytes, held=held,
    )  # fmt: skip
    compiled_programs.append(_compile(program, swap, hbm_bytes)[0])
  return compiled_programs


def run(
    config: ml_collections.ConfigDict,
    topology: str,
    *,
    config_name: str = "",
    update: bool = True,
    samplers: bool = True,
    engine: bool = False,
    roles: Sequence[str] = ("agent", "designer"),
    engine_windows: int = 2,
    bytes_breakdown: bool = False,
    engine_gathered: bool = True,
    hlo_dir: str = "",
    log=print,
) -> Report:
  """Compiles the config's programs for the named slice; returns the report.

  Args:
    config: a validated config.
    topology: a slice name of `spade.model.topology` (e.g. "v5p-32").
    config_name: shown in the report.
    update: compile the update step.
    samplers: also compile each role's prefill and decode step.
    engine: also compile each role's slot-engine programs
      (`compile_engine`).
    roles: whose sampler and engine programs to compile ("agent",
      "designer").
    engine_windows: how many of the engine's cache windows, largest first,
      each engine program is compiled on (0: all; see `compile_engine`).
    bytes_breakdown: also log, for each role's generate programs (every
      slot and gathered rows), where their bytes per token go
      (`spade.hlo_bytes`; `breakdown_lines`).
    engine_gathered: also compile generate on each count of gathered live
      rows the server can choose (`SlotEngine.rows`).
    hlo_dir: write each generate program's compiled HLO text there.
    log: called with each program's line as it finishes.
  """
  roles = _roles(roles)
  tpu = topology_lib.parse(topology)
  devices = tpu.devices()
  mesh = sharding.make_mesh(config.mesh, devices)
  rules = tuple(
      (name, tuple(axes) if isinstance(axes, list) else axes)
      for name, axes in config.mesh.rules
  )
  hbm = tpu.hbm_gib * GIB
  optimizer = state_lib.make_optimizer(config.optim)
  state = abstract_state(config, mesh, rules, optimizer)
  report = Report(config_name, tpu, dict(mesh.shape), [])

  def add(program: Program) -> None:
    report.programs.append(program)
    log(describe(program, tpu))
    if program.bytes_per_token:
      log(bytes_line(program))
    if bytes_breakdown and program.breakdown is not None:
      for line in breakdown_lines(
          program, tpu.chips, program.rows, config.sampling.decode_steps
      ):
        log(line)

  if update:
    add(compile_update(config, mesh, rules, state, optimizer, hbm))
  if samplers:
    for role in roles:
      for program in compile_sampler(config, mesh, rules, state, role, hbm):
        add(program)
  if engine:
    for role in roles:
      for program in compile_engine(
          config,
          mesh,
          rules,
          state,
          role,
          hbm,
          engine_windows,
          engine_gathered,
          hlo_dir,
      ):
        add(program)
  return report


def _roles(roles: Sequence[str]) -> list[str]:
  """The named roles in the order they compile; ValueError on any other."""
  known = sorted(r.key for r in transformer.Role)
  if not roles or set(roles) - set(known):
    raise ValueError(f"roles must be some of {known}, not {list(roles)}")
  return [r for r in known if r in roles]


def per_step_bytes(b: hlo_bytes.Breakdown, steps: int) -> tuple[float, float]:
  """(XLA's bytes accessed, the HBM bytes by `spade.hlo_bytes`' rules) of
  one decode step with what runs once a call spread over its `steps`
  steps: a call's bytes over the steps it makes (per device). XLA's total
  has no split by loop: its once-a-call part is taken to be the share the
  rules count outside the loops (the rules and XLA differ by `unexplained`,
  which for the gathered programs is larger than a step's bytes, so
  subtracting the rules' bytes from XLA's would go below zero)."""
  outside = sum(b.outside.values())
  once = b.xla_total * outside / b.total if b.total else 0.0
  per_step = b.xla_total - once + once / max(steps, 1)
  hbm_outside = sum(b.hbm_outside.values())
  hbm = sum(b.hbm.values()) - hbm_outside + hbm_outside / max(steps, 1)
  return per_step, hbm


def bytes_line(program: Program) -> str:
  """A generate program's bytes per generated token against the minimum,
  one `key=value` line (bytes, the slice's): XLA's `bytes accessed` for the
  loop body and what runs once a call, counted as one step (so an upper
  bound; `breakdown_lines`' `per_step` spreads the once-a-call part). Then
  the HBM traffic (`hbm_bytes_per_token=`, `hbm_ratio=`): `spade.hlo_bytes`'
  rules, a step's with the once-a-call part spread over the call's steps;
  XLA's count also has the traffic inside the chip (a prefetch to VMEM
  counted as its write there, the matmul's read of it again)."""
  name = program.name.replace(" ", "_")
  line = (
      f"program={name} bytes_per_token={program.bytes_per_token:.0f}"
      f" minimum={program.min_bytes_per_token:.0f}"
      f" ratio={program.bytes_ratio:.2f}"
  )
  if program.hbm_bytes_per_token:
    line += (
        f" hbm_bytes_per_token={program.hbm_bytes_per_token:.0f}"
        f" hbm_ratio={program.hbm_ratio:.2f}"
    )
  return line


def breakdown_lines(
    program: Program, chips: int, slots: int, steps: int = 1
) -> list[str]:
  """A generate program's bytes per generated token by category: one
  `key=value` line (MiB a token, the slice's: per device x chips / slots,
  as `bytes_per_token`; XLA's split, then `hbm_*`, the HBM traffic's),
  then its costliest operations by HBM traffic, one a line.

  XLA's total, like `bytes_per_token`, counts what runs outside the decode
  loop (once a call of `steps` decode steps) as if it ran every step;
  `per_step_mib` spreads it over the call's steps instead, and
  `per_step_ratio` is that over the minimum."""
  b = program.breakdown
  key = program.key + "_bytes_"
  scale = chips / slots
  per_step, hbm = per_step_bytes(b, steps)
  per_step, hbm = per_step * scale, hbm * scale
  pairs = b.lines(key, scale) + [f"{key}per_step_mib={per_step / 2**20:.2f}"]
  pairs.append(f"{key}hbm_per_step_mib={hbm / 2**20:.2f}")
  if program.min_bytes_per_token:
    ratio = per_step / program.min_bytes_per_token
    pairs.append(f"{key}per_step_ratio={ratio:.2f}")
    pairs.append(
        f"{key}hbm_per_step_ratio={hbm / program.min_bytes_per_token:.2f}"
    )
  lines = [" ".join(pairs)]
  # By HBM traffic (`hlo_bytes`' rules), the roofline's: XLA's own count
  # takes every fusion's operands whole, so a program that slices the
  # cache where it lies (the gathered calls in place) would list every
  # row's read.
  for size, split, label in b.hbm_top or b.top:
    parts = ",".join(
        f"{k}:{v * scale / 2**20:.2f}" for k, v in split.items() if v
    )
    lines.append(f"  {size * scale / 2**20:9.2f} MiB/token {label} [{parts}]")
  return lines


def describe(program: Program, tpu: topology_lib.Slice) -> str:
  """One human line per program."""
  head = f"{program.name} [{program.shape}]"
  if program.error:
    return f"{head}: DOES NOT FIT ({program.compile_s:.1f} s): {program.error}"
  at_peak = program.model_flops / (tpu.chips * tpu.peak_bf16_flops)
  held = ""
  if program.held_bytes:
    held = f" + held {program.held_bytes / GIB:.2f} ({program.held})"
  return (
      f"{head}: per device args {program.argument_bytes / GIB:.2f} GiB, out"
      f" {program.output_bytes / GIB:.2f} (aliased"
      f" {program.alias_bytes / GIB:.2f}), temp"
      f" {program.temp_bytes / GIB:.2f}, peak {program.peak_bytes / GIB:.2f}"
      f"{held} GiB of {tpu.hbm_gib:g} GiB HBM"
      f"{'' if program.fits else ' (OVER)'};"
      f" model {program.model_flops:.3g} FLOP/call, >= {at_peak:.4g} s at"
      f" {tpu.chips} x {tpu.peak_bf16_flops / 1e12:g} TFLOP/s (MFU = this /"
      f" measured); XLA {program.xla_flops:.3g} FLOP/device (loop bodies"
      f" once); compiled in {program.compile_s:.1f} s"
      + (
          f"; {program.bytes_per_token / 2**20:.2f} MiB accessed per token vs"
          f" {program.min_bytes_per_token / 2**20:.2f} minimum (weights +"
          f" cache once): x{program.bytes_ratio:.2f}"
          if program.bytes_per_token
          else ""
      )
  )


def _define_flags() -> None:
  """The CLI's flags, defined only when run as a program: importing
  `spade.compile` as a library (tests, notebooks) next to `spade.main`,
  which defines its own --config, must not clash."""
  config_flags.DEFINE_config_file(
      "config", None, "Config file, e.g. configs/gemma3_tpu.py:1b"
  )
  flags.DEFINE_string(
      "topology", None, "TPU slice name, e.g. v5p-8, v5p-32, v5e-16, v6e-8."
  )
  flags.DEFINE_bool("update", True, "Compile the update step.")
  flags.DEFINE_bool(
      "samplers", True, "Also compile each role's prefill and decode step."
  )
  flags.DEFINE_bool(
      "engine",
      True,
      "Also compile each role's slot-engine programs (prefill-insert,"
      " generate): what the loop samples with.",
  )
  flags.DEFINE_list(
      "roles",
      ["agent", "designer"],
      "Whose sampler and engine programs to compile (agent, designer).",
  )
  flags.DEFINE_bool(
      "bytes_breakdown",
      False,
      "With --engine: print where each generate program's bytes per token"
      " go (weights, cache reads and writes, copies, gathers, loop state,"
      " other; spade.hlo_bytes) and its costliest operations.",
  )
  flags.DEFINE_bool(
      "engine_gathered",
      True,
      "With --engine: also compile generate on each count of gathered live"
      " rows the server can choose (sampling.min_rows; SlotEngine.rows), each"
      " with its peak; --noengine_gathered: every slot only.",
  )
  flags.DEFINE_string(
      "hlo_dir",
      "",
      "With --engine: write each generate program's compiled HLO text to"
      " DIR/<program key>.hlo.txt (e.g. for spade.hlo_bytes).",
  )
  flags.DEFINE_integer(
      "engine_windows",
      2,
      "Compile each engine program on this many of its cache windows,"
      " largest first (they bound the smaller ones' peak); 0: every window.",
  )


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    sys.exit(f"spade.compile: unexpected arguments: {' '.join(argv[1:])}")
  f = flags.FLAGS
  if f.config is None or not f.topology:
    sys.exit("spade.compile: --config and --topology are required")
  engine = f.engine
  if not (f.update or f.samplers or engine):
    sys.exit(
        "spade.compile: --noupdate, --nosamplers and --noengine leave nothing"
        " to compile"
    )
  config = f.config
  try:
    config_lib.validate(config)
    sharding.make_mesh(config.mesh, topology_lib.parse(f.topology).devices())
  except (config_lib.ConfigError, topology_lib.TopologyError, ValueError) as e:
    sys.exit(f"spade.compile: {e}")
  try:
    _roles(f.roles)
  except ValueError as e:
    sys.exit(f"spade.compile: --{e}")
  report = run(
      config,
      f.topology,
      config_name=f["config"].config_filename,
      update=f.update,
      samplers=f.samplers,
      engine=engine,
      roles=f.roles,
      engine_windows=f.engine_windows,
      bytes_breakdown=f.bytes_breakdown,
      engine_gathered=f.engine_gathered,
      hlo_dir=f.hlo_dir,
      log=lambda line: print(line, flush=True),
  )
  print(report.summary(), flush=True)
  sys.exit(0 if report.fits else 1)


if __name__ == "__main__":
  _define_flags()
  app.run(main)
