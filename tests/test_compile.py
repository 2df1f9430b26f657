"""`spade.compile`: the tiny config compiles for a v5p-8 slice from this CPU.

Needs libtpu (`pip install -e .[tpu]`, part of `launch/setup.sh dev`): its
topology description gives the slice's devices without any chips.
"""

import importlib.util
import os

import pytest

pytest.importorskip("libtpu", reason="needs jax[tpu]: pip install -e .[tpu]")

# pylint: disable=g-import-not-at-top,wrong-import-position
from spade import compile as compile_lib
from spade import hlo_bytes
from spade.model import topology

GIB = 1024**3
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tiny(**overrides):
  spec = importlib.util.spec_from_file_location(
      "tiny", os.path.join(ROOT, "configs", "tiny.py")
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config()
  # Short rows and prompts: the program is the same, the compile is quicker.
  c.model.max_len = 256
  c.agent.max_context = 64
  c.agent.max_new_tokens = 16
  c.designer.max_prompt_tokens = 64
  c.designer.max_new_tokens = 64
  c.compile.agent_len = 128
  for dotted, value in overrides.items():
    node = c
    *path, key = dotted.split("__")
    for part in path:
      node = node[part]
    node[key] = value
  return c


def test_tiny_config_compiles_and_fits_a_v5p_8():
  lines = []
  report = compile_lib.run(
      _tiny(), "v5p-8", config_name="tiny", log=lines.append
  )
  names = [p.name for p in report.programs]
  assert names == [
      "update",
      "agent prefill",
      "agent decode",
      "designer prefill",
      "designer decode",
  ]
  assert report.slice.chips == 4 and report.mesh_shape["data"] == 4
  hbm = topology.parse("v5p-8").hbm_gib * GIB
  for p in report.programs:
    assert p.fits, p
    assert p.argument_bytes > 0 and p.peak_bytes > 0, p
    assert p.peak_bytes < hbm
    assert p.model_flops > 0 and p.xla_flops > 0
    assert p.compile_s > 0
  update = report.programs[0]
  # The state (params + two Adam moments) is an argument and is donated.
  assert update.alias_bytes > 0
  assert update.shape.startswith("agent 16x128, designer 4x128")
  assert len(lines) == len(report.programs)
  summary = dict(kv.split("=", 1) for kv in report.summary().split())
  assert summary["fits"] == "True"
  assert summary["hbm_gib"] == "95"
  assert summary["topology"] == "v5p-8"
  assert 0 < float(summary["peak_gib_per_device"]) < 95


def test_an_absurd_batch_does_not_fit():
  # 4M tokens through a 16k-wide MLP without micro-batches or remat: the
  # saved activations alone are hundreds of GiB per chip.
  c = _tiny(
      model__embed_dim=4096,
      model__mlp_dim=16384,
      model__max_len=4096,
      compile__agent_rows=1024,
      compile__agent_len=4096,
  )
  report = compile_lib.run(c, "v5p-8", samplers=False, log=lambda _: None)
  (update,) = report.programs
  assert not report.fits and not update.fits
  # Either the compiler refuses (RESOURCE_EXHAUSTED) or its peak is over.
  assert update.error or update.peak_bytes > 95 * GIB
  assert "fits=False" in report.summary()


@pytest.mark.parametrize(
    "name, chips, kind",
    [
        ("v5p-32", 16, "TPU v5"),
        ("v4-8", 4, "TPU v4"),
        ("v5e-16", 16, "TPU v5 lite"),
        ("v6e-8", 8, "TPU v6 lite"),
    ],
)
def test_slice_names_give_the_slice_devices(name, chips, kind):
  devices = topology.parse(name).devices()
  assert len(devices) == chips
  assert {d.device_kind for d in devices} == {kind}


def _cache_bytes(c, rows, slots):
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from spade.model import transformer  # pylint: disable=g-import-not-at-top

  fns = transformer.sampling_fns(c.model, transformer.Role.AGENT)
  shapes = jax.eval_shape(lambda: fns.init_cache(rows, slots))
  return sum(
      int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(shapes)
  )


@pytest.mark.slow
def test_the_agent_sampler_is_the_evaluation_responders_call():
  # The loop's rollout samples through the slot engine; the agent's
  # lock-step call is the evaluation responder's, eval.batch_size prompts,
  # and nothing else is held beside it but the optimizer state.
  c = _tiny(designer__num_envs=4, agent__episodes_per_env=4)
  c.eval.batch_size = 8
  report = compile_lib.run(
      c, "v5p-8", update=False, roles=["agent"], log=lambda _: None
  )
  prefill, decode = report.programs
  assert prefill.name == "agent prefill" and prefill.shape.startswith("8x")
  assert prefill.held == decode.held
  assert prefill.held.startswith("optimizer state") and "," not in prefill.held
  assert prefill.held_bytes > 0


def test_roles_must_name_a_role():
  with pytest.raises(ValueError, match="roles must be some of"):
    compile_lib.run(_tiny(), "v5p-8", roles=["critic"], log=lambda _: None)


def test_decode_takes_the_parameters_in_their_shards():
  # fsdp=2: each chip holds its shard of every weight in the sampler's decode
  # step too (the compiled prefill's output shardings, not a replica).
  import jax  # pylint: disable=g-import-not-at-top
  from spade import config as config_lib  # pylint: disable=g-import-not-at-top
  from spade.model import sharding  # pylint: disable=g-import-not-at-top
  from spade.model import transformer  # pylint: disable=g-import-not-at-top

  # Dimensions in whole TPU tiles (128 lanes), so a shard is not padded.
  c = _tiny(
      mesh__fsdp=2,
      model__vocab_size=512,
      model__embed_dim=512,
      model__num_heads=2,
      model__num_kv_heads=2,
      model__head_dim=128,
      model__mlp_dim=1024,
  )
  report = compile_lib.run(
      c, "v5p-8", update=False, roles=["agent"], log=lambda _: None
  )
  prefill, decode = report.programs
  fns = transformer.sampling_fns(c.model, transformer.Role.AGENT)
  prepared = jax.eval_shape(
      lambda: fns.prepare_params(
          transformer.init_params(c.model, jax.random.PRNGKey(0))
      )
  )
  mesh = sharding.make_mesh(c.mesh, topology.parse("v5p-8").devices())
  shardings = sharding.fitted_param_shardings(
      prepared, mesh, config_lib.base_config().mesh.rules
  )
  whole = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(prepared))
  shard = compile_lib.device_bytes(
      jax.tree.map(
          lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
          prepared,
          shardings,
      )
  )
  assert shard < 0.55 * whole
  rows = int(prefill.shape.split("x", 1)[0])
  slots = int(prefill.shape.rsplit("cache ", 1)[1])
  cache = _cache_bytes(c, rows, slots) // 4  # rows over data 2 x fsdp 2
  # The decode step's parameters are this chip's shards: about half of
  # them, where a replica would be all. Beside them and the cache it takes
  # a few small arrays (the rows' tokens, lengths, rng: under 64 KiB).
  params = decode.argument_bytes - cache
  assert 0.4 * whole < params <= shard + 65536, (params, shard, whole)


def _small_engine(c):
  """A slot engine of 8 slots, 4-row prefills, 4 steps a call."""
  c.sampling.slots = 8
  c.sampling.prefill_rows = 4
  c.sampling.decode_steps = 4
  c.sampling.prefill_chunk = 64


@pytest.mark.slow
def test_slot_engine_programs_compile_and_report_bytes_per_token(tmp_path):
  c = _tiny()
  _small_engine(c)
  lines = []
  report = compile_lib.run(
      c, "v5p-8", update=False, samplers=False, engine=True,
      bytes_breakdown=True, hlo_dir=str(tmp_path), log=lines.append,
  )  # fmt: skip
  names = [p.name for p in report.programs]
  # Generate over every slot, then over the 4 gathered live rows the server
  # can run on (`sampling.min_rows` 4 of 8 slots), taken out and, when
  # they are each shard's first, in place; and the swap that moves them
  # there.
  assert names == [
      "agent slots prefill-insert",
      "agent slots generate",
      "agent slots generate on 4 rows",
      "agent slots generate on 4 rows in place",
      "agent slots swap",
      "designer slots prefill-insert",
      "designer slots generate",
      "designer slots generate on 4 rows",
      "designer slots generate on 4 rows in place",
      "designer slots swap",
  ]
  # Each generate program's line is followed by its bytes line, its
  # breakdown's line and its ten costliest operations.
  assert report.fits and len(lines) == 2 * (1 + 13 * 3 + 1)
  for p in report.programs:
    assert p.fits and p.peak_bytes > 0 and p.argument_bytes > 0, p
    # The decode state (every slot's cache) is donated and kept in place.
    assert p.alias_bytes > 0, p
    assert "optimizer state" in p.held and p.held_bytes > 0
  prefill, generate, gathered = report.programs[:3]
  # The gathered rows' program: its own peak, and its bytes per token
  # against its 4 rows' minimum (the weights read for 4 tokens, not 8).
  assert gathered.rows == 4 and generate.rows == 8
  assert gathered.bytes_per_token > 0
  assert gathered.min_bytes_per_token > generate.min_bytes_per_token
  summary_keys = dict(kv.split("=", 1) for kv in report.summary().split())
  assert float(summary_keys["agent_rows4_bytes_ratio"]) == pytest.approx(
      gathered.bytes_ratio, abs=0.01
  )
  assert lines[15].startswith("program=agent_slots_generate_on_4_rows ")
  # Its breakdown: the take of its rows' cache and the put back run once a
  # call, outside the loop, so a step's share of them is a call's over its
  # steps (`per_step_mib`).
  rows4 = dict(kv.split("=", 1) for kv in lines[16].split())
  outside4 = float(rows4["agent_rows4_bytes_outside_loops_mib"])
  assert gathered.breakdown is not None and outside4 > 0
  once4 = outside4 / float(rows4["agent_rows4_bytes_total_mib"])
  per_step4 = float(rows4["agent_rows4_bytes_per_step_mib"])
  assert 0 < per_step4 < gathered.bytes_per_token / 2**20
  assert per_step4 == pytest.approx(
      gathered.bytes_per_token / 2**20 * (1 - once4 * 3 / 4), abs=0.02
  )
  # The engine's windows are 64, 96, 128, 192 and the whole cache; each
  # program is compiled on the two largest, as the server calls it.
  assert prefill.shape.startswith("4 rows into 8 slots x cache 256")
  assert prefill.shape.endswith("windows 192, 256 of 5")
  assert generate.shape == (
      "8 slots x cache 256, 4 steps a call, windows 192, 256 of 5"
  )
  assert generate.model_flops > 0 and generate.xla_flops > 0
  # A step reads at least the weights and the live cache once.
  assert generate.min_bytes_per_token > 0
  assert generate.bytes_ratio >= 0.9, generate
  assert "accessed per token" in lines[1]
  bytes_pairs = dict(kv.split("=", 1) for kv in lines[2].split())
  assert bytes_pairs["program"] == "agent_slots_generate"
  assert int(bytes_pairs["bytes_per_token"]) == round(generate.bytes_per_token)
  assert int(bytes_pairs["minimum"]) == round(generate.min_bytes_per_token)
  assert float(bytes_pairs["ratio"]) == pytest.approx(
      generate.bytes_ratio, abs=0.01
  )
  # HBM traffic alone, per token: a step's (`step_hbm_bytes`, per chip, the
  # once-a-call part spread) over the 8 tokens the 4 chips make a step.
  assert int(bytes_pairs["hbm_bytes_per_token"]) == round(
      generate.step_hbm_bytes * 4 / 8
  )
  assert 0 < generate.hbm_bytes_per_token < generate.bytes_per_token
  assert float(bytes_pairs["hbm_ratio"]) == pytest.approx(
      generate.hbm_bytes_per_token / generate.min_bytes_per_token, abs=0.01
  )
  # Where those bytes go: the categories sum to XLA's own total within 5%
  # (the TPU compiler's cost rules, re-applied op by op: 2% here).
  b = generate.breakdown
  assert b.xla_total > 0
  assert abs(b.unexplained) < 0.05 * b.xla_total, b.lines()
  assert b.bytes["weights"] > 0 and b.bytes["cache_read"] > 0
  assert b.bytes["cache_write"] > 0
  assert lines[3].startswith("agent_slots_bytes_weights_mib=")
  pairs = dict(kv.split("=", 1) for kv in lines[3].split())
  assert float(pairs["agent_slots_bytes_xla_total_mib"]) == pytest.approx(
      generate.bytes_per_token / 2**20, abs=0.01
  )
  # HBM's share by the same rules: no more than every byte, and the
  # cache it reads is in it (the weights a step prefetches into VMEM count
  # once, as the prefetch's read).
  assert 0 < sum(b.hbm.values()) <= b.total
  assert b.hbm["cache_read"] > 0
  # The HBM split is printed beside XLA's (per token: chips / slots = 4 / 8),
  # and the program's HLO was written where asked, the same module.
  assert float(pairs["agent_slots_bytes_hbm_cache_read_mib"]) == pytest.approx(
      b.hbm["cache_read"] * 4 / 8 / 2**20, abs=0.01
  )
  written = (tmp_path / "agent_slots.hlo.txt").read_text()
  assert hlo_bytes.breakdown_text(written).hbm == b.hbm
  assert (
      0
      < float(pairs["agent_slots_bytes_hbm_per_step_mib"])
      <= float(pairs["agent_slots_bytes_per_step_mib"])
      + float(pairs["agent_slots_bytes_outside_loops_mib"])
  )
  # What runs outside the loop, once a call, spread over its 4 steps: its
  # share of XLA's total is the rules' share outside the loop.
  outside = float(pairs["agent_slots_bytes_outside_loops_mib"])
  assert outside > 0
  once = outside / float(pairs["agent_slots_bytes_total_mib"])
  assert float(pairs["agent_slots_bytes_per_step_mib"]) == pytest.approx(
      generate.bytes_per_token / 2**20 * (1 - once * 3 / 4), abs=0.02
  )
  summary = dict(kv.split("=", 1) for kv in report.summary().split())
  assert float(summary["agent_slots_bytes_ratio"]) == pytest.approx(
      generate.bytes_ratio, abs=0.01
  )
  assert float(summary["agent_slots_hbm_ratio"]) == pytest.approx(
      generate.hbm_ratio, abs=0.01
  )
  assert float(summary["agent_rows4_hbm_ratio"]) == pytest.approx(
      gathered.hbm_ratio, abs=0.01
  )
  # A step's HBM bytes per device, gathered against every slot: the
  # breakdown's per-token figure times the tokens a chip makes a step.
  chips = 4
  assert generate.step_hbm_bytes / 2**20 == pytest.approx(
      float(pairs["agent_slots_bytes_hbm_per_step_mib"]) * 8 / chips,
      abs=0.01,
  )
  vs = gathered.step_hbm_bytes / generate.step_hbm_bytes
  assert float(summary["agent_rows4_step_vs_every_slot"]) == pytest.approx(
      vs, abs=0.01
  )
  # In place: the 4 rows' cache is read where it lies, so nothing is taken
  # or put back once a call, and a step reads their half of the cache.
  in_place = report.programs[3]
  assert in_place.key == "agent_rows4_in_place" and in_place.rows == 4
  assert in_place.shape.endswith("windows 256 of 5")
  ib = in_place.breakdown
  once = lambda p: sum(p.breakdown.hbm_outside.values())
  assert once(in_place) <= once(generate) < once(gathered), (
      once(in_place), once(generate), once(gathered),
  )  # fmt: skip
  assert ib.hbm["cache_read"] < 0.6 * b.hbm["cache_read"]
  assert in_place.step_hbm_bytes < gathered.step_hbm_bytes
  # The server's gathered call is the one in place: whether it pays.
  vs = in_place.step_hbm_bytes / generate.step_hbm_bytes
  assert float(summary["agent_rows4_in_place_step_vs_every_slot"]) == (
      pytest.approx(vs, abs=0.01)
  )
  assert summary["agent_gather_pays_up_to"] == ("4" if vs < 1 else "0")
  # The target's figure: every slot's and the call in place's, not the
  # taken rows' (the server does not call it here).
  called = max(round(p.hbm_ratio, 2) for p in (generate, in_place))
  assert float(summary["agent_hbm_ratio_max"]) == pytest.approx(called)


@pytest.mark.slow
def test_the_minimum_reads_weights_and_cache_once_however_many_chips_hold_them():
  """The cache's rows go over the batch axes and its KV heads over tensor
  (`kv_cache.CACHE_AXES`), so each chip holds and reads only its own heads
  of its own rows; the minimum counts the cache once and the weights once a
  data replica, whatever the mesh."""
  import jax  # pylint: disable=g-import-not-at-top
  from spade.model import kv_cache  # pylint: disable=g-import-not-at-top

  minimum, held, step = {}, {}, {}
  for fsdp, tensor in ((4, 1), (2, 2)):
    c = _tiny(mesh__fsdp=fsdp, mesh__tensor=tensor)
    _small_engine(c)
    report = compile_lib.run(
        c, "v5p-8", update=False, samplers=False, engine=True,
        roles=["agent"], engine_windows=1, engine_gathered=False,
        log=lambda _: None,
    )  # fmt: skip
    generate = report.programs[1]
    assert generate.rows == 8
    minimum[tensor] = generate.min_bytes_per_token
    held[tensor] = generate.argument_bytes
    step[tensor] = generate.step_hbm_bytes
  cache = jax.eval_shape(lambda: kv_cache.init_cache(c.model, 8, 256))
  per_token = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(cache)) / 8
  # The cache is most of the minimum here, and the minimum is the same on
  # both meshes (counted from each chip's bytes, the two were 7% apart).
  assert per_token > 0.5 * minimum[1]
  assert minimum[2] == pytest.approx(minimum[1])
  # Two batch shards of two heads each hold no more than four batch shards
  # of both heads, and a step on them reads no more (with the heads whole
  # on every tensor chip: 40% more held, 13% more read a step).
  assert held[2] <= held[1]
  assert step[2] <= step[1]


def test_gathering_pays_up_to_the_largest_count_below_every_slot():
  """`<role>_gather_pays_up_to`: the largest gathered count such that it
  and every smaller count read less a step than every slot."""

  def gen(rows, step, role="agent"):
    name = f"{role} slots generate" + (f" on {rows} rows" if rows < 64 else "")
    return compile_lib.Program(name, "", rows=rows, step_hbm_bytes=step)

  programs = [gen(64, 100.0), gen(32, 120.0), gen(16, 90.0), gen(8, 50.0),
              gen(4, 10.0), gen(64, 100.0, "designer"),
              gen(4, 150.0, "designer")]  # fmt: skip
  pairs = compile_lib.gather_pairs(programs)
  assert pairs == {
      "agent_rows4_step_vs_every_slot": "0.10",
      "agent_rows8_step_vs_every_slot": "0.50",
      "agent_rows16_step_vs_every_slot": "0.90",
      "agent_rows32_step_vs_every_slot": "1.20",
      "agent_gather_pays_up_to": "16",
      "designer_rows4_step_vs_every_slot": "1.50",
      "designer_gather_pays_up_to": "0",
  }
  # Without breakdowns there is nothing to compare.
  assert compile_lib.gather_pairs([gen(64, 0.0), gen(4, 0.0)]) == {}


def test_the_target_ratio_is_the_highest_of_the_programs_the_server_calls():
  """`<role>_hbm_ratio_max`: the highest `hbm_ratio` of every slot's
  program and the gathered counts' the server calls: in place when they
  were compiled so, else on taken rows."""

  def gen(rows, ratio, where="", role="agent"):
    name = f"{role} slots generate"
    if rows < 64:
      name += f" on {rows} rows" + (" in place" if where else "")
    return compile_lib.Program(
        name, "", rows=rows, hbm_bytes_per_token=ratio, min_bytes_per_token=1
    )

  taken = [gen(64, 1.2), gen(32, 1.4), gen(16, 1.1)]
  in_place = [gen(32, 1.25, "in place"), gen(16, 1.15, "in place")]
  prefill = compile_lib.Program("agent slots prefill-insert", "")
  designer = [gen(64, 1.3, role="designer"), gen(16, 1.5, role="designer")]
  pairs = compile_lib.called_ratio_pairs(
      [prefill, *taken, *in_place, *designer]
  )
  assert pairs == {
      "agent_hbm_ratio_max": "1.25",
      "designer_hbm_ratio_max": "1.50",
  }
  # Without programs in place the taken rows' are the server's.
  assert compile_lib.called_ratio_pairs(taken) == {
      "agent_hbm_ratio_max": "1.40"
  }
  # Without breakdowns there is no ratio to hold.
  assert compile_lib.called_ratio_pairs([prefill]) == {}


@pytest.mark.parametrize("layout", ["stationary", "fsdp"])
def test_a_decode_step_moves_rows_not_weights(layout):
  # fsdp=4: with `model.decode_sharding="stationary"` each chip multiplies
  # the rows by its own shard of every weight, so the generate loop
  # all-gathers activations only; "fsdp" (training's layout) all-gathers
  # every weight, every step.
  c = _tiny(
      mesh__fsdp=4,
      model__vocab_size=1024,
      model__embed_dim=512,
      model__num_heads=2,
      model__num_kv_heads=2,
      model__head_dim=128,
      model__mlp_dim=1024,
      model__decode_sharding=layout,
  )
  _small_engine(c)
  report = compile_lib.run(
      c, "v5p-8", update=False, samplers=False, engine=True, roles=["agent"],
      engine_windows=1, bytes_breakdown=True, log=lambda _: None,
  )  # fmt: skip
  generate = report.programs[1]
  b = generate.breakdown
  in_loop = b.bytes["all_gather"] - b.outside.get("all_gather", 0.0)
  # The layers' and the output layer's weights, one chip's whole copy in
  # the sampler's float32 (what an all-gather of them writes).
  weights = 4 * (
      2 * 1024 * 512 + c.model.num_layers * 512 * (6 * 128 + 3 * 1024)
  )
  if layout == "stationary":
    assert in_loop < 0.05 * weights, (in_loop, weights, b.lines())
  else:
    assert in_loop > 0.4 * weights, (in_loop, weights, b.lines())


def test_a_mesh_off_the_slices_torus_says_which_sizes_fit():
  from spade.model import sharding  # pylint: disable=g-import-not-at-top

  devices = topology.parse("v5p-128").devices()  # 64 chips, a 4x4x4 torus
  good = sharding.make_mesh({"data": -1, "fsdp": 16, "tensor": 4}, devices)
  assert dict(good.shape) == {"data": 1, "fsdp": 16, "tensor": 4}
  with pytest.raises(ValueError, match=r"data=2, fsdp=8, tensor=4.*4x4x4"):
    sharding.make_mesh({"data": -1, "fsdp": 8, "tensor": 4}, devices)
