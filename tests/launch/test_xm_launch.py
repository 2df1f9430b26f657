"""XManager launcher: slice arithmetic, override pass-through, dry runs.

None of this needs XManager, JAX or a cloud: the dry run is the contract.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from spade import config as config_lib

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


def _load_launcher():
  spec = importlib.util.spec_from_file_location(
      "xm_launch", os.path.join(ROOT, "launch", "xm_launch.py")
  )
  module = importlib.util.module_from_spec(spec)
  # dataclasses resolve string annotations through sys.modules.
  sys.modules["xm_launch"] = module
  spec.loader.exec_module(module)
  return module


xl = _load_launcher()


def _config(name, arg=None):
  spec = importlib.util.spec_from_file_location(
      name, os.path.join(ROOT, "configs", name + ".py")
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


@pytest.mark.parametrize(
    "spec, gen, chips, hosts, per_host, topology",
    [
        ("v5p-8", "v5p", 4, 1, 4, "2x2x1"),
        ("v5p-32", "v5p", 16, 4, 4, "2x2x4"),
        ("v5p-256", "v5p", 128, 32, 4, "4x4x8"),
        ("v4-8", "v4", 4, 1, 4, "2x2x1"),
        ("v4-128", "v4", 64, 16, 4, "4x4x4"),
        ("v5e-1", "v5e", 1, 1, 1, "1x1"),
        ("v5e-8", "v5e", 8, 1, 8, "2x4"),
        ("v5litepod-16", "v5e", 16, 4, 4, "4x4"),
        ("v5e-256", "v5e", 256, 64, 4, "16x16"),
        ("v6e-4", "v6e", 4, 1, 4, "2x2"),
        ("v6e-64", "v6e", 64, 16, 4, "8x8"),
    ],
)
def test_tpu_slice_rules(spec, gen, chips, hosts, per_host, topology):
  a = xl.parse_tpu(spec)
  assert (a.type, a.count, a.hosts, a.per_host, a.topology) == (
      gen,
      chips,
      hosts,
      per_host,
      topology,
  )
  assert a.hosts * a.per_host == a.count
  assert a.xm_resource == "TPU_" + gen.upper()


def test_tpu_topology_override_must_match_chips():
  assert xl.parse_tpu("v5p-256", "4x4x8_twisted").topology == "4x4x8_twisted"
  with pytest.raises(xl.LaunchError, match="128 chips"):
    xl.parse_tpu("v5p-256", "4x4x4")


@pytest.mark.parametrize(
    "spec, needle",
    [
        ("v5p-12", "multiple of 8"),
        ("v6e-12", "slices have"),
        ("v9-8", "unknown TPU generation"),
        ("v5p", "not a TPU slice name"),
        ("v5e-512", "slices have"),
    ],
)
def test_bad_tpu_names_say_what_to_write(spec, needle):
  with pytest.raises(xl.LaunchError, match=needle):
    xl.parse_tpu(spec)


def test_gpu_vm():
  a = xl.parse_gpu("h100:8")
  assert (a.kind, a.type, a.count, a.hosts, a.xm_resource) == (
      "gpu",
      "h100",
      8,
      1,
      "H100",
  )
  assert xl.parse_gpu("a100:16").count == 16
  with pytest.raises(xl.LaunchError, match="1 to 8"):
    xl.parse_gpu("h100:16")
  with pytest.raises(xl.LaunchError, match="MODEL:COUNT"):
    xl.parse_gpu("k80:2")


def test_split_argv_keeps_overrides_verbatim_and_in_order():
  argv = [
      "xm_launch.py",
      "--config=configs/tiny.py",
      "--config.model.num_layers=4",
      "--tpu=v5p-8",
      "--config.train.mode=fixed_pool",
      "--config.model.qk_norm",
  ]
  own, overrides = xl.split_argv(argv)
  assert own == ["xm_launch.py", "--config=configs/tiny.py", "--tpu=v5p-8"]
  assert overrides == [
      "--config.model.num_layers=4",
      "--config.train.mode=fixed_pool",
      "--config.model.qk_norm",
  ]
  with pytest.raises(xl.LaunchError, match="--config.seed=3"):
    xl.split_argv(["x", "--config.seed", "3"])


def test_mesh_resolves_on_the_slice():
  c = _config("gemma3_tpu", "12b")
  assert xl.check_mesh(c, xl.parse_tpu("v5p-256")) == {
      "data": 2,
      "fsdp": 16,
      "tensor": 4,
  }
  with pytest.raises(xl.LaunchError, match="multiple of 64"):
    xl.check_mesh(c, xl.parse_tpu("v5p-32"))


def test_build_jobs_single_host_has_no_distributed_flag():
  plan = xl.build_jobs(
      "configs/gemma3_tpu.py:1b", [], xl.parse_tpu("v5p-8"), "gs://b/run"
  )
  (job,) = plan["jobs"]
  assert job["hosts"] == 1
  assert not any(t.startswith("--num_processes") for t in job["command"])
  assert job["xm_requirements"] == {"TPU_V5P": "2x2x1"}


def _run_cli(*args):
  return subprocess.run(
      [sys.executable, os.path.join("launch", "xm_launch.py"), *args],
      cwd=ROOT,
      capture_output=True,
      text=True,
      check=False,
      timeout=120,
  )


def test_dry_run_cli_prints_one_json_job_with_the_override():
  proc = _run_cli(
      "--dry_run",
      "--config=configs/gemma3_tpu.py:1b",
      "--config.num_iterations=7",
      "--tpu=v5p-32",
  )
  assert proc.returncode == 0, proc.stderr
  plan = json.loads(proc.stdout.strip().splitlines()[-1])
  (job,) = plan["jobs"]
  assert job["accelerator"]["type"] == "v5p"
  assert job["accelerator"]["count"] == 16
  assert job["hosts"] == 4
  assert job["command"][:4] == [
      "python",
      "-m",
      "spade.main",
      "--config=configs/gemma3_tpu.py:1b",
  ]
  assert job["command"][-1] == "--config.num_iterations=7"
  assert "--num_processes=4" in job["command"]
  assert "--config.num_iterations=7" in job["command_line"]
  assert job["image"]["source"] == "build"
  assert job["mesh"] == {"data": 4, "fsdp": 4, "tensor": 1}
  assert job["xm_requirements"] == {"TPU_V5P": "2x2x4", "replicas": 4}


def test_dry_run_gpu_with_prebuilt_image_and_variant():
  proc = _run_cli(
      "--dry_run",
      "--config=configs/gemma3_tpu.py:4b,runlocal",
      "--gpu=h100:8",
      "--image=us-docker.pkg.dev/p/r/spade:1",
      "--workdir=/mnt/runs/a",
      "--config.agent.max_turns=3",
  )
  assert proc.returncode == 0, proc.stderr
  (job,) = json.loads(proc.stdout.strip().splitlines()[-1])["jobs"]
  assert job["image"] == {
      "source": "prebuilt",
      "path": "us-docker.pkg.dev/p/r/spade:1",
  }
  assert job["executor"] == "vertex"
  assert job["command"] == [
      "python",
      "-m",
      "spade.main",
      "--config=configs/gemma3_tpu.py:4b,runlocal",
      "--workdir=/mnt/runs/a",
      "--config.agent.max_turns=3",
  ]
  assert job["mesh"] == {"data": 2, "fsdp": 2, "tensor": 2}


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--config.no_such_key=1"], "no_such_key"),
        (["--config.agent.max_turns=0"], "agent.max_turns"),
        (["--gpu=h100:8"], "exactly one of"),
        (["--config=configs/nope.py"], "no such file"),
    ],
)
def test_dry_run_errors_are_one_line(args, needle):
  base = ["--dry_run", "--tpu=v5p-8"]
  if not any(a.startswith("--config=") for a in args):
    base.append("--config=configs/gemma3_tpu.py:1b")
  proc = _run_cli(*base, *args)
  assert proc.returncode == 2
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and needle in lines[0], proc.stderr


def test_real_launch_without_xmanager_says_how_to_install(capsys, monkeypatch):
  # The test setup installs xmanager ([launch]); hide it as if it were not.
  for name in ("xmanager", "xmanager.xm", "xmanager.xm_local"):
    monkeypatch.setitem(sys.modules, name, None)
  status = xl.main(
      [
          "xm_launch.py",
          "--config=configs/gemma3_tpu.py:1b",
          "--tpu=v5p-8",
          "--workdir=gs://b/run",
      ]
  )
  assert status == 2
  assert "pip install -e .[launch]" in capsys.readouterr().err


@pytest.mark.parametrize("size", ["1b", "4b", "12b", "27b"])
def test_gemma3_configs_pod_and_runlocal(size):
  c = _config("gemma3_tpu", size)
  config_lib.validate(c)
  layers, embed = {
      "1b": (26, 1152),
      "4b": (34, 2560),
      "12b": (48, 3840),
      "27b": (62, 5376),
  }[size]
  assert (c.model.num_layers, c.model.embed_dim) == (layers, embed)
  assert c.model.vocab_size == 262_144
  for dim in (c.model.num_heads, c.model.mlp_dim, c.model.vocab_size):
    assert dim % c.mesh.tensor == 0  # the tensor axis splits them evenly
  assert (c.designer.num_envs, c.agent.episodes_per_env) == (24, 16)
  assert c.agent.max_turns == 25
  assert c.tokenizer.kind == "gemma_sp" and c.model.dtype == "bfloat16"
  small = _config("gemma3_tpu", f"{size},runlocal")
  config_lib.validate(small)
  assert small.model.num_layers == 2 and small.tokenizer.kind == "bytes"
  assert small.mesh.fsdp * small.mesh.tensor == 4  # fits 8 fake devices
  with pytest.raises(ValueError, match="runlocal"):
    _config("gemma3_tpu", f"{size},huge")


def test_27b_scales_queries_by_embed_over_heads():
  c = _config("gemma3_tpu", "27b")
  assert c.model.query_scale == c.model.embed_dim / c.model.num_heads == 168
  assert c.model.head_dim == 128


@pytest.mark.parametrize("size", ["1b", "4b", "12b", "27b"])
def test_gemma3_configs_match_the_model_shape_table(size):
  # The configs keep their own table so the launcher needs no JAX; this keeps
  # it equal to the model package's.
  from spade.model import architecture  # pylint: disable=g-import-not-at-top

  c = _config("gemma3_tpu", size)
  for key, value in architecture.gemma3_shapes(size).items():
    assert c.model[key] == value, key


# Trunk parameters (embedding + layers, without the output layer) of the
# published Gemma 3 text models: 1B exactly, the others to 3 digits.
_TRUNK_PARAMS = {"1b": 999_885_952, "4b": 3.88e9, "12b": 11.77e9, "27b": 27.0e9}


@pytest.mark.parametrize("size", ["1b", "4b", "12b", "27b"])
def test_gemma3_pod_configs_have_the_published_size(size):
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from spade.model import transformer  # pylint: disable=g-import-not-at-top

  c = _config("gemma3_tpu", size)
  model = transformer.build_model(c.model)
  tokens = jnp.zeros((1, 1), jnp.int32)
  # Shapes only: no memory, no compilation.
  shapes = jax.eval_shape(
      lambda r: model.init(r, tokens, tokens, transformer.Role.DESIGNER),
      jax.random.key(0),
  )
  params = nn.unbox(shapes["params"])
  total = sum(x.size for x in jax.tree_util.tree_leaves(params))
  heads = sum(x.size for x in jax.tree_util.tree_leaves(params["heads"]))
  # One output layer, both roles' (`model.separate_heads=False`).
  assert heads == c.model.vocab_size * c.model.embed_dim
  trunk = total - heads
  if isinstance(_TRUNK_PARAMS[size], int):
    assert trunk == _TRUNK_PARAMS[size]
  else:
    assert trunk == pytest.approx(_TRUNK_PARAMS[size], rel=2e-3)


def test_runlocal_builds_and_shards_on_8_cpu_devices():
  import jax  # pylint: disable=g-import-not-at-top
  from spade.model import sharding  # pylint: disable=g-import-not-at-top
  from spade.model import transformer  # pylint: disable=g-import-not-at-top

  c = _config("gemma3_tpu", "1b,runlocal")
  assert jax.device_count() == 8
  mesh = sharding.make_mesh(c.mesh)
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
  params = transformer.init_params(c.model, jax.random.key(0))
  placed = sharding.shard_params(params, mesh, c.mesh.rules)
  leaves = jax.tree_util.tree_leaves(placed)
  assert sum(x.size for x in leaves) == sum(
      x.size for x in jax.tree_util.tree_leaves(params)
  )
  # Some parameter is split across devices, not just replicated.
  assert any(x.sharding.shard_shape(x.shape) != x.shape for x in leaves)


def test_xm_requirements_when_xmanager_is_installed():
  from xmanager import xm  # the [launch] extra, which the test setup installs

  plan = xl.build_jobs(
      "configs/tiny.py", [], xl.parse_tpu("v5p-32"), "gs://b/r", validate=False
  )
  req = xl.xm_requirements(xm, plan["jobs"][0])
  assert req.accelerator == xm.ResourceType.TPU_V5P
  assert req.topology == xm.Topology("2x2x4")
  assert req.replicas == 4


def test_gke_manifests_one_pod_per_host_with_tpu_selectors():
  plan = xl.build_jobs(
      "configs/tiny.py",
      ["--config.seed=3"],
      xl.parse_tpu("v5p-32"),
      "gs://b/r",
      image="us-docker.pkg.dev/p/r/spade:1",
  )
  (job,) = plan["jobs"]
  service, k8s_job = job["gke"]
  assert service["kind"] == "Service" and service["spec"]["clusterIP"] == "None"
  name = service["metadata"]["name"]
  assert name == "spade-tiny-v5p-32" == k8s_job["metadata"]["name"]
  spec = k8s_job["spec"]
  assert spec["completionMode"] == "Indexed"
  assert spec["completions"] == spec["parallelism"] == 4
  pod = spec["template"]["spec"]
  assert pod["subdomain"] == name  # the headless service names the hosts
  assert pod["nodeSelector"] == {
      "cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
      "cloud.google.com/gke-tpu-topology": "2x2x4",
  }
  (container,) = pod["containers"]
  assert container["resources"]["limits"] == {"google.com/tpu": 4}
  assert container["image"] == "us-docker.pkg.dev/p/r/spade:1"
  assert container["command"] == job["command"]
  assert container["command"][-1] == "--config.seed=3"


def test_gke_manifests_single_host_v6e():
  plan = xl.build_jobs(
      "configs/tiny.py", [], xl.parse_tpu("v6e-8"), "gs://b/r", validate=False
  )
  _, k8s_job = plan["jobs"][0]["gke"]
  pod = k8s_job["spec"]["template"]["spec"]
  assert k8s_job["spec"]["completions"] == 1
  assert pod["nodeSelector"]["cloud.google.com/gke-tpu-accelerator"] == (
      "tpu-v6e-slice"
  )
  assert pod["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "2x4"
  assert pod["containers"][0]["resources"]["limits"] == {"google.com/tpu": 8}
  assert (
      "gke"
      not in xl.build_jobs(
          "configs/tiny.py", [], xl.parse_gpu("h100:8"), "/w", validate=False
      )["jobs"][0]
  )


@pytest.mark.parametrize(
    "spec", ["v5p-8", "v5p-32", "v4-128", "v5e-16", "v6e-8"]
)
def test_launcher_and_compiler_read_one_slice_table(spec):
  from spade.model import topology  # pylint: disable=g-import-not-at-top

  a, s = xl.parse_tpu(spec), topology.parse(spec)
  assert (a.type, a.name, a.count, a.hosts, a.per_host, a.topology) == (
      s.generation,
      s.name,
      s.chips,
      s.hosts,
      s.per_host,
      s.topology,
  )
  assert a.xm_resource == s.spec.xm_resource


def test_compile_topology_arguments():
  from spade.model import topology  # pylint: disable=g-import-not-at-top

  # The arguments under which libtpu describes a v5p-32 slice from a CPU.
  assert topology.parse("v5p-32").topology_desc_args() == dict(
      platform="tpu",
      topology_name="v5:2x2x4",
      chip_config_name="megacore",
      chips_per_host_bounds=(2, 2, 1),
      num_slices=1,
  )
  v6e = topology.parse("v6e-8").topology_desc_args()
  assert v6e["topology_name"] == "v6e:2x4"
  assert v6e["chip_config_name"] == "default"
  assert v6e["chips_per_host_bounds"] == (2, 4, 1)
  assert topology.parse("v5e-16").topology_desc_args()[
      "chips_per_host_bounds"
  ] == (2, 2, 1)
