r"""Launches SPADE with XManager on a Cloud TPU slice or a GPU VM.

  python launch/xm_launch.py --config=configs/gemma3_tpu.py:1b --tpu=v5p-32 \
      --workdir=gs://BUCKET/spade/run1 --config.num_iterations=7

  python launch/xm_launch.py --dry_run --config=configs/gemma3_tpu.py:1b \
      --config.num_iterations=7 --tpu=v5p-32

The job runs `python -m spade.main --config=... --workdir=...` on every host of
the slice. Every argv token that starts with `--config.` is passed to that
command line verbatim, in order; it is also applied here to validate the
config before anything is launched, so a typo costs a second, not a pod.

`--dry_run` prints the job(s) it would launch as ONE JSON object on the last
line of stdout (image, command line, accelerator type and count, hosts) and
contacts no cloud. It needs neither XManager nor JAX: only `ml_collections`
`spade.config` (to validate) and `spade.model.topology` (the slice table
`spade.compile` uses too). A real launch imports XManager lazily and
says `pip install -e .[launch]` when it is missing.

Accelerator rules (Cloud TPU "supported configurations" pages):

  v4-N, v5p-N   N counts TensorCores, 2 per chip: chips = N/2; every host
                (TPU VM) has 4 chips: hosts = chips/4. v5p-32 = 16 chips on
                4 hosts, topology 2x2x4. JAX sees one device per chip
                (megacore).
  v5e-N, v6e-N  N counts chips (v5e is also written v5litepod-N). Slices of
                1, 4 or 8 chips are one host; larger slices are built from
                4-chip hosts (ct5lp-hightpu-4t / ct6e-standard-4t):
                hosts = N/4. v6e-16 = 16 chips on 4 hosts, topology 4x4.
  --gpu=TYPE:K  K GPUs of TYPE on one VM (K <= 8; a100 also 16).

Multi-host: each host runs the same command; with more than one host the
launcher adds `--num_processes=HOSTS`, and `spade.main` then calls
`jax.distributed.initialize()`, which on Cloud TPU discovers the coordinator
and this host's process id by itself (no other flag needed).

Where: XManager builds and pushes the image (or `--image` names one). GPU
jobs go to XManager's Vertex AI executor. TPU jobs become an Indexed Job (one
pod per host) plus a headless Service on the current GKE cluster
(`gke_manifests`), since XManager's open-source GKE executor neither requests
TPUs nor starts one pod per host.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import sys
from typing import Any, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The TPU slice table is shared with `spade.compile`, so a config that
# compiles for a topology name is the config that launches on it.
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)
from spade.model import topology as topology_lib  # pylint: disable=wrong-import-position

# GPU name on the command line -> (XManager resource, most GPUs on one VM).
_GPU_KINDS = {
    "t4": ("T4", 4),
    "l4": ("L4_24TH", 8),
    "v100": ("V100", 8),
    "a100": ("A100", 16),
    "a100_80gib": ("A100_80GIB", 8),
    "h100": ("H100", 8),
    "h200": ("H200", 8),
    "b200": ("B200", 8),
}

DEFAULT_BASE_IMAGE = "python:3.11-slim"


class LaunchError(ValueError):
  """A launch request that cannot be honoured; the message says what to do."""


@dataclasses.dataclass(frozen=True)
class Accelerator:
  """What one job asks for: a TPU slice or a GPU VM.

  Attributes:
    kind: "tpu" or "gpu".
    type: generation or model, e.g. "v5p" or "h100".
    name: as written on the command line, e.g. "v5p-32" or "h100:8".
    count: chips (TPU) or GPUs in the whole job.
    hosts: VMs in the job; one process each.
    per_host: chips or GPUs on each host (JAX's local device count).
    topology: slice shape such as "2x2x4" (TPU), or the GPU count.
    xm_resource: the `xm.ResourceType` member name, e.g. "TPU_V5P".
  """

  kind: str
  type: str
  name: str
  count: int
  hosts: int
  per_host: int
  topology: str
  xm_resource: str


def parse_tpu(spec: str, topology: str | None = None) -> Accelerator:
  """Parses `v5p-32`-style names into chips, hosts and topology.

  Args:
    spec: `v4-N`, `v5p-N` (N TensorCores), `v5e-N`, `v5litepod-N` or `v6e-N`
      (N chips).
    topology: slice shape to use instead of the default one for that size,
      e.g. "4x4x8" or "4x4x8_twisted"; its chip count must match.

  Returns:
    The `Accelerator`.

  Raises:
    LaunchError: unknown generation or a size Cloud TPU does not offer.
  """
  try:
    tpu = topology_lib.parse(spec, topology)
  except topology_lib.TopologyError as e:
    raise LaunchError(f"--tpu={spec}: {e}") from None
  return Accelerator(
      kind="tpu",
      type=tpu.generation,
      name=tpu.name,
      count=tpu.chips,
      hosts=tpu.hosts,
      per_host=tpu.per_host,
      topology=tpu.topology,
      xm_resource=tpu.spec.xm_resource,
  )


def parse_gpu(spec: str) -> Accelerator:
  """Parses `h100:8` (GPU model and count on one VM).

  Raises:
    LaunchError: unknown model, or more GPUs than one VM of that model holds.
  """
  match = re.fullmatch(r"([a-z0-9_]+)(?::(\d+))?", spec.strip().lower())
  if not match or match[1] not in _GPU_KINDS:
    raise LaunchError(
        f"--gpu={spec!r}: write MODEL:COUNT with MODEL one of "
        f"{sorted(_GPU_KINDS)}, e.g. --gpu=h100:8"
    )
  resource, most = _GPU_KINDS[match[1]]
  count = int(match[2] or 1)
  if not 1 <= count <= most:
    raise LaunchError(
        f"--gpu={spec}: one {match[1]} VM holds 1 to {most} GPUs; this "
        "launcher starts single-VM GPU jobs (use a TPU slice for more hosts)"
    )
  return Accelerator(
      kind="gpu",
      type=match[1],
      name=f"{match[1]}:{count}",
      count=count,
      hosts=1,
      per_host=count,
      topology=str(count),
      xm_resource=resource,
  )


def _product(values: Sequence[int]) -> int:
  out = 1
  for v in values:
    out *= v
  return out


def split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
  """Splits argv into the launcher's own flags and the `--config.*` overrides.

  Overrides keep their order and spelling. Each must carry its value in the
  same token (`--config.a.b=VALUE`), or be a bare boolean, because the token
  after it is not forwarded.

  Returns:
    (launcher argv including argv[0], override tokens).

  Raises:
    LaunchError: an override written as two tokens.
  """
  own, overrides = [argv[0]], []
  for i, token in enumerate(argv[1:], start=1):
    if token.startswith("--config."):
      following = argv[i + 1] if i + 1 < len(argv) else ""
      if "=" not in token and following and not following.startswith("-"):
        raise LaunchError(
            f"write {token}={following} (with '='): overrides are forwarded "
            "one token each"
        )
      overrides.append(token)
    else:
      own.append(token)
  return own, overrides


def resolve_config(config_arg: str) -> tuple[str, str]:
  """Finds the config file; the job needs it inside this repository.

  Args:
    config_arg: `path.py[:variant]`, relative to the current directory or to
      the repository root, or absolute.

  Returns:
    (absolute `path.py[:variant]` for loading here, the same relative to the
    repository root for the job's command line, which runs there).

  Raises:
    LaunchError: no such file, or a file outside the repository.
  """
  path, sep, variant = config_arg.partition(":")
  candidates = [os.path.abspath(path), os.path.join(ROOT, path)]
  found = next((c for c in candidates if os.path.isfile(c)), None)
  if found is None:
    raise LaunchError(f"--config={config_arg}: no such file {path!r}")
  rel = os.path.relpath(found, ROOT)
  if rel.startswith(".."):
    raise LaunchError(
        f"--config={config_arg}: the file must be inside the repository "
        f"({ROOT}), since the job runs from a copy of it"
    )
  return found + sep + variant, rel + sep + variant


def load_config(config_arg: str, overrides: Sequence[str]):
  """Loads `config_arg` (`file.py[:variant]`), applies and validates overrides.

  Uses `ml_collections.config_flags`, the parser `spade.main` uses, so an
  override that works here works on the pod.

  Raises:
    LaunchError: the file, an override or the resulting config is bad.
  """
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top

  if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
  from spade import config as config_lib  # pylint: disable=g-import-not-at-top

  config_arg = resolve_config(config_arg)[0]
  argv = ["xm_launch", f"--config={config_arg}", *overrides]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file(
      "config", None, flag_values=values, sys_argv=argv
  )
  try:
    values(argv)
    config = values.config
  except (KeyError, AttributeError) as e:
    key = str(e).strip("\"' ")
    bad = [o for o in overrides if key in o] or list(overrides)
    raise LaunchError(
        f"unknown config key {key!r} in {' '.join(bad) or config_arg}"
    ) from e
  except (flags.Error, TypeError, ValueError) as e:
    raise LaunchError(
        f"bad config or override ({' '.join(overrides) or config_arg}): "
        f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
    ) from e
  try:
    config_lib.validate(config)
  except config_lib.ConfigError as e:
    raise LaunchError(str(e)) from e
  return config


def check_mesh(config, accel: Accelerator) -> dict[str, int]:
  """Resolves `config.mesh` on the job's devices; errors if it cannot fit.

  Returns:
    {"data": d, "fsdp": f, "tensor": t} with d * f * t == devices.
  """
  devices = accel.count
  sizes = {a: int(config.mesh[a]) for a in ("data", "fsdp", "tensor")}
  fixed = _product([s for s in sizes.values() if s != -1])
  free = [a for a, s in sizes.items() if s == -1]
  if len(free) > 1:
    raise LaunchError("config.mesh: at most one axis may be -1")
  if devices % fixed:
    raise LaunchError(
        f"config.mesh needs a multiple of {fixed} devices (fsdp * tensor * "
        f"data) but {accel.name} has {devices}; pick a larger slice or "
        "override --config.mesh.fsdp / --config.mesh.tensor"
    )
  if free:
    sizes[free[0]] = devices // fixed
  elif fixed != devices:
    raise LaunchError(
        f"config.mesh uses {fixed} devices but {accel.name} has {devices}; "
        "set --config.mesh.data=-1"
    )
  return sizes


def image_spec(accel: Accelerator, image: str | None, base_image: str):
  """Describes the container: a prebuilt image, or one built from this repo."""
  if image:
    return {"source": "prebuilt", "path": image}
  jax_extra = "jax[tpu]" if accel.kind == "tpu" else "jax[cuda12]"
  return {
      "source": "build",
      "base_image": base_image,
      "path": ROOT,
      "docker_instructions": [
          # gVisor runs the designer's programs; bubblewrap is the fallback.
          "RUN apt-get update && apt-get install -y --no-install-recommends"
          " runsc bubblewrap && rm -rf /var/lib/apt/lists/*",
          "COPY . /spade",
          "WORKDIR /spade",
          f"RUN pip install --no-cache-dir -e .[eval] '{jax_extra}'",
      ],
  }


def build_jobs(
    config_arg: str,
    overrides: Sequence[str],
    accel: Accelerator,
    workdir: str,
    *,
    image: str | None = None,
    base_image: str = DEFAULT_BASE_IMAGE,
    experiment_title: str | None = None,
    validate: bool = True,
) -> dict[str, Any]:
  """Builds the description of what a launch starts; contacts nothing.

  Args:
    config_arg: the config file, optionally with `:variant`, relative to the
      repository root (that is where the job runs).
    overrides: `--config.*` tokens, forwarded verbatim.
    accel: from `parse_tpu` or `parse_gpu`.
    workdir: where the job writes (a `gs://` path for pods).
    image: a prebuilt image to run instead of building one from this repo.
    base_image: the image the build starts from.
    experiment_title: the XManager experiment's title.
    validate: load the config with the overrides and check it and its mesh.

  Returns:
    A JSON-able dict: {"experiment_title", "jobs": [job]}; each job has name,
    image, command (list), command_line (str), accelerator, hosts, mesh,
    executor and xm_requirements.
  """
  if not workdir:
    raise LaunchError("--workdir is required (e.g. gs://BUCKET/spade/run1)")
  mesh = None
  if validate:
    mesh = check_mesh(load_config(config_arg, overrides), accel)
  rel_config = resolve_config(config_arg)[1]
  command = [
      "python",
      "-m",
      "spade.main",
      f"--config={rel_config}",
      f"--workdir={workdir}",
  ]
  if accel.hosts > 1:
    # spade.main then calls jax.distributed.initialize(), which reads the
    # coordinator and this host's id from the Cloud TPU metadata.
    command.append(f"--num_processes={accel.hosts}")
  command.extend(overrides)
  name = os.path.splitext(os.path.basename(rel_config.split(":", 1)[0]))[0]
  title = experiment_title or f"spade-{name}-{accel.name.replace(':', 'x')}"
  requirements = {accel.xm_resource: accel.topology}
  if accel.hosts > 1:
    requirements["replicas"] = accel.hosts
  job = {
      "name": title,
      "image": image_spec(accel, image, base_image),
      "command": command,
      "command_line": shlex.join(command),
      "accelerator": {
          "kind": accel.kind,
          "type": accel.type,
          "name": accel.name,
          "count": accel.count,
          "per_host": accel.per_host,
          "topology": accel.topology,
      },
      "hosts": accel.hosts,
      "mesh": mesh,
      # XManager's Vertex executor maps only TPU v2/v3, so TPU slices go to
      # GKE; single-VM GPU jobs go to Vertex AI.
      "executor": "gke" if accel.kind == "tpu" else "vertex",
      "xm_requirements": requirements,
  }
  if accel.kind == "tpu":
    image_path = image or "<the image XManager builds from this repository>"
    job["gke"] = gke_manifests(job, image_path)
  return {"experiment_title": title, "jobs": [job]}


def _import_xmanager():
  """Imports XManager, or raises a LaunchError that says how to install it."""
  try:
    # pylint: disable=g-import-not-at-top
    from xmanager import xm
    from xmanager import xm_local
    # pylint: enable=g-import-not-at-top
  except ImportError as e:
    raise LaunchError(
        "a real launch needs XManager: run `pip install -e .[launch]` in the "
        "repository root (or use --dry_run to only print the job)"
    ) from e
  return xm, xm_local


def xm_requirements(xm, job: dict[str, Any]):
  """Turns a job's `xm_requirements` into `xm.JobRequirements`."""
  resources = dict(job["xm_requirements"])
  replicas = resources.pop("replicas", None)
  ((resource_name, quantity),) = resources.items()
  resource = getattr(xm.ResourceType, resource_name, None)
  if resource is None:
    raise LaunchError(
        f"this XManager has no xm.ResourceType.{resource_name}; upgrade with "
        "`pip install -e .[launch]` (needs xmanager>=0.8.5)"
    )
  return xm.JobRequirements({resource: quantity}, replicas=replicas)


def gke_manifests(
    job: dict[str, Any], image_path: str, namespace: str = "default"
) -> list[dict[str, Any]]:
  """Kubernetes objects that run a TPU job on a GKE TPU slice node pool.

  An Indexed Job with one pod per host (`completions = parallelism = hosts`)
  and a headless Service named like it: for such pods GKE sets
  TPU_WORKER_ID and TPU_WORKER_HOSTNAMES, from which
  `jax.distributed.initialize()` learns the coordinator and process id.

  Args:
    job: one job of a `build_jobs` plan, with a TPU accelerator.
    image_path: the container image the pods run.
    namespace: the Kubernetes namespace.

  Returns:
    [Service, Job] as plain dicts (the `kubernetes` client accepts them).
  """
  accel = job["accelerator"]
  if accel["kind"] != "tpu":
    raise LaunchError("gke_manifests is for TPU jobs")
  name = _k8s_name(job["name"])
  service = {
      "apiVersion": "v1",
      "kind": "Service",
      "metadata": {"name": name, "namespace": namespace},
      "spec": {"clusterIP": "None", "selector": {"job-name": name}},
  }
  container = {
      "name": "spade",
      "image": image_path,
      "command": job["command"],
      "workingDir": "/spade",
      # 8476: JAX's coordinator; 8471: the TPU runtime between hosts.
      "ports": [{"containerPort": 8476}, {"containerPort": 8471}],
      # gVisor's runsc starts sandboxes inside the pod: it needs the
      # privileges a container runtime has.
      "securityContext": {"privileged": True},
      "resources": {"limits": {"google.com/tpu": accel["per_host"]}},
  }
  k8s_job = {
      "apiVersion": "batch/v1",
      "kind": "Job",
      "metadata": {"name": name, "namespace": namespace},
      "spec": {
          "completionMode": "Indexed",
          "completions": job["hosts"],
          "parallelism": job["hosts"],
          "backoffLimit": 0,
          "template": {
              "metadata": {"labels": {"job-name": name}},
              "spec": {
                  "subdomain": name,
                  "restartPolicy": "Never",
                  "nodeSelector": {
                      "cloud.google.com/gke-tpu-accelerator": (
                          topology_lib.GENERATIONS[
                              accel["type"]
                          ].gke_accelerator
                      ),
                      "cloud.google.com/gke-tpu-topology": (
                          accel["topology"].split("_")[0]
                      ),
                  },
                  "containers": [container],
              },
          },
      },
  }
  return [service, k8s_job]


def _k8s_name(title: str) -> str:
  """A DNS-1123 label: lower case, digits and '-', at most 63 characters."""
  name = re.sub(r"[^a-z0-9-]+", "-", title.lower()).strip("-")
  return name[:63].rstrip("-") or "spade"


def launch(plan: dict[str, Any], namespace: str = "default") -> None:
  """Starts the planned job: XManager builds and pushes the image.

  GPU jobs then run through XManager's Vertex AI executor. TPU jobs are
  created on the current GKE cluster (kubectl's context) from
  `gke_manifests`, because XManager's open-source GKE executor neither
  requests TPUs nor runs one pod per host.
  """
  xm, xm_local = _import_xmanager()
  (job,) = plan["jobs"]
  executor_cls = (
      xm_local.Kubernetes if job["executor"] == "gke" else xm_local.Vertex
  )
  img = job["image"]
  if img["source"] == "prebuilt":
    spec = xm.Container(image_path=img["path"])
    args = job["command"]
  else:
    spec = xm.PythonContainer(
        path=img["path"],
        base_image=img["base_image"],
        docker_instructions=img["docker_instructions"],
        entrypoint=xm.CommandList([job["command_line"]]),
    )
    args = []
  with xm_local.create_experiment(
      experiment_title=plan["experiment_title"]
  ) as experiment:
    if job["executor"] == "gke" and img["source"] == "prebuilt":
      image_path = img["path"]  # nothing to build or push
    else:
      [executable] = experiment.package(
          [
              xm.Packageable(
                  executable_spec=spec,
                  executor_spec=executor_cls.Spec(),
                  args=args,
              )
          ]
      )
      image_path = getattr(executable, "image_path", None)
    if job["executor"] == "gke":
      _create_on_gke(gke_manifests(job, image_path, namespace))
    else:
      experiment.add(
          xm.Job(
              executable=executable,
              executor=executor_cls(requirements=xm_requirements(xm, job)),
          )
      )
    print(f"launched experiment {experiment.experiment_id}: {job['name']}")


def _create_on_gke(manifests: list[dict[str, Any]]) -> None:
  """Creates the objects with the `kubernetes` client (an XManager dep)."""
  # pylint: disable=g-import-not-at-top
  from kubernetes import client
  from kubernetes import config as k8s_config

  # pylint: enable=g-import-not-at-top
  k8s_config.load_kube_config()
  for obj in manifests:
    namespace = obj["metadata"]["namespace"]
    if obj["kind"] == "Service":
      client.CoreV1Api().create_namespaced_service(namespace, obj)
    else:
      client.BatchV1Api().create_namespaced_job(namespace, obj)


def _define_flags():
  """Defines the launcher's flags on a fresh `FlagValues` (re-entrant)."""
  from absl import flags  # pylint: disable=g-import-not-at-top

  fv = flags.FlagValues()
  for name, default, help_text in (
      ("config", None, "Config file[:variant], e.g. configs/gemma3_tpu.py:1b"),
      ("workdir", None, "Where the job writes (gs://...)."),
      ("tpu", None, "TPU slice, e.g. v5p-32, v4-8, v5e-16, v6e-8."),
      ("tpu_topology", None, "Slice shape instead of the size's default."),
      ("gpu", None, "GPU VM, e.g. h100:8."),
      ("image", None, "Prebuilt image (repository at /spade) to run."),
      ("base_image", DEFAULT_BASE_IMAGE, "Base of the image built here."),
      ("experiment_title", None, "XManager experiment title."),
  ):
    flags.DEFINE_string(name, default, help_text, flag_values=fv)
  flags.DEFINE_bool(
      "dry_run", False, "Print the job as JSON; launch nothing.", flag_values=fv
  )
  return fv


def main(argv: Sequence[str]) -> int:
  """Parses argv, prints or launches the job; returns the exit status."""
  try:
    own, overrides = split_argv(argv)
  except LaunchError as e:
    print(f"xm_launch: error: {e}", file=sys.stderr)
    return 2
  from absl import flags  # pylint: disable=g-import-not-at-top

  flag_values = _define_flags()
  try:
    rest = flag_values(own)
  except flags.Error as e:
    print(f"xm_launch: error: {str(e).splitlines()[0]}", file=sys.stderr)
    return 2
  try:
    if len(rest) > 1:
      raise LaunchError(f"unexpected arguments: {' '.join(rest[1:])}")
    if not flag_values.config:
      raise LaunchError("--config is required, e.g. configs/gemma3_tpu.py:1b")
    if bool(flag_values.tpu) == bool(flag_values.gpu):
      raise LaunchError("give exactly one of --tpu=v5p-32 or --gpu=h100:8")
    accel = (
        parse_tpu(flag_values.tpu, flag_values.tpu_topology)
        if flag_values.tpu
        else parse_gpu(flag_values.gpu)
    )
    workdir = flag_values.workdir
    if not workdir and flag_values.dry_run:
      workdir = (
          "gs://BUCKET/spade/"
          + os.path.splitext(
              os.path.basename(flag_values.config.split(":", 1)[0])
          )[0]
      )
    plan = build_jobs(
        flag_values.config,
        overrides,
        accel,
        workdir,
        image=flag_values.image,
        base_image=flag_values.base_image,
        experiment_title=flag_values.experiment_title,
    )
    if flag_values.dry_run:
      if not flag_values.workdir:
        plan["notes"] = [f"no --workdir given: {workdir} is a placeholder"]
      print(json.dumps(plan, sort_keys=True))
      return 0
    launch(plan)
  except LaunchError as e:
    print(f"xm_launch: error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
