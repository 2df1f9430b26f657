r"""Start-up time of a GGUF checkpoint: first load, then from the converted copy.

Runs `spade.model.loading.initial_params` for a config twice, each time
in a fresh process (as a run would start), with an empty `$SPADE_CACHE`: the
first dequantizes the GGUF file and keeps the converted copy
(`spade.model.converted_cache`), the second reads that copy. Each child reports the seconds inside `initial_params`
its CPU seconds there (the figure a busy machine distorts least) and its own
wall time (imports included); the last figure is the 1-minute load average.

  python benchmarks/checkpoint_load.py [--config=configs/gemma3_270m.py]

Last line: first_load_s=... cached_load_s=... first_cpu_s=... cached_cpu_s=...
first_process_s=... cached_process_s=... speedup=... load_average=...
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

_CHILD = r"""
import importlib.util, json, sys, time
start = time.perf_counter()
import jax
from spade.model import loading
spec = importlib.util.spec_from_file_location("config", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
config = module.get_config()
t0, c0 = time.perf_counter(), time.process_time()
jax.block_until_ready(loading.initial_params(config))
load, cpu = time.perf_counter() - t0, time.process_time() - c0
print(json.dumps({"load_s": load, "load_cpu_s": cpu,
                  "process_s": time.perf_counter() - start}))
"""


def _run(config: str, cache: str) -> dict:
  env = dict(os.environ, SPADE_CACHE=cache, JAX_PLATFORMS="cpu")
  start = time.perf_counter()
  out = subprocess.run(
      [sys.executable, "-c", _CHILD, config],
      env=env,
      capture_output=True,
      text=True,
      check=False,
  )
  if out.returncode:
    sys.exit(f"child failed:\n{out.stderr[-4000:]}")
  sys.stderr.write(out.stderr)
  result = json.loads(out.stdout.strip().splitlines()[-1])
  result["wall_s"] = time.perf_counter() - start
  return result


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="configs/gemma3_270m.py")
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as cache:
    first = _run(args.config, cache)
    cached = _run(args.config, cache)
  print(
      f"first_load_s={first['load_s']:.1f} cached_load_s="
      f"{cached['load_s']:.1f} first_cpu_s={first['load_cpu_s']:.1f} "
      f"cached_cpu_s={cached['load_cpu_s']:.1f} "
      f"first_process_s={first['process_s']:.1f} "
      f"cached_process_s={cached['process_s']:.1f} "
      f"speedup={first['load_s'] / cached['load_s']:.1f} "
      f"load_average={os.getloadavg()[0]:.1f}"
  )


if __name__ == "__main__":
  main()
