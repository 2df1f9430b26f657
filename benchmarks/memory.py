"""Memory and grounding costs on the host: what they add to an iteration.

Fills an archive with `--size` programs of seed-library size (variants of the
seed environments, so every add runs the full near-duplicate check against
every entry), then times: one add (signatures + duplicate search) at that
size, a rejected renamed copy, `replay(8)`, `prompt_examples`, `metrics()`
(diversity over the newest 256), `state_dict()` + JSON and its size, and
`from_state_dict`. For grounding: building the built-in corpus and sampling
from it. The last line is key=value pairs.

  python benchmarks/memory.py [--size 1000]
"""

import argparse
import glob
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top
from spade import config as config_lib
from spade import console
from spade.grounding import build_corpus
from spade.memory import Archive

# pylint: enable=g-import-not-at-top


def _seed_programs() -> list[str]:
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  files = sorted(glob.glob(os.path.join(root, "spade/environments/seeds/*.py")))
  programs = []
  for f in files:
    with open(f) as fh:
      programs.append(fh.read())
  if not programs:
    raise SystemExit("no seed environments under spade/environments/seeds")
  return programs


def _timed(fn, repeats: int = 1):
  start = time.perf_counter()
  for _ in range(repeats):
    out = fn()
  return (time.perf_counter() - start) / repeats, out


def main() -> None:
  console.no_tpu_probe()  # before JAX starts a backend: no libtpu page
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--size", type=int, default=1000)
  args = parser.parse_args()

  cfg = config_lib.base_config()
  cfg.memory.capacity = args.size + 10
  # Variants differ by a table of 40 numbers: accepted at threshold 1.0, yet
  # the duplicate search still compares each add with every entry.
  cfg.memory.duplicate_threshold = 1.0
  seeds = _seed_programs()
  archive = Archive(cfg.memory)
  fill_start = time.perf_counter()
  rejected = 0
  for k in range(args.size):
    table = ", ".join(str(k * 7919 + i * 104729) for i in range(40))
    code = seeds[k % len(seeds)] + f"\n_VARIANT = [{table}]\n"
    env_id, _ = archive.add(code, verdict={"valid": True}, iteration=k // 8)
    if env_id is None:
      rejected += 1
      continue
    archive.update_stats(
        env_id,
        iteration=k // 8,
        regret=(k * 37 % 100) / 100,
        win_rate_hint=0.5,
        win_rate_nohint=0.25,
        episodes=8,
    )
  fill_s = time.perf_counter() - fill_start
  mean_code = sum(len(e.code) for e in archive.entries()) / len(archive)

  table = ", ".join(str(-i * 15485863) for i in range(1, 41))
  new = seeds[0] + f"\n_VARIANT = [{table}]\n"
  add_s, (new_id, _) = _timed(
      lambda: archive.add(new, verdict={"valid": True}, iteration=10_000)
  )
  assert new_id is not None, "the new program should have been archived"
  copy = new.replace("self.", "self.x_")  # a renamed copy
  dup_s, (_, dup_of) = _timed(
      lambda: archive.add(copy, verdict={"valid": True}, iteration=10_000)
  )
  assert dup_of == new_id, "the renamed copy should have been rejected"
  archive.replay(8, 0, 10_001)  # compile once
  replay_s, _ = _timed(lambda: archive.replay(8, 1, 10_002), repeats=5)
  examples_s, _ = _timed(lambda: archive.prompt_examples(None, 4), repeats=5)
  metrics_s, metrics = _timed(archive.metrics)
  state_s, text = _timed(lambda: json.dumps(archive.state_dict()))
  restore_s, _ = _timed(
      lambda: Archive.from_state_dict(cfg.memory, json.loads(text))
  )

  corpus_s, corpus = _timed(lambda: build_corpus(cfg.grounding))
  sample_s, _ = _timed(lambda: corpus.sample(24), repeats=20)

  print(
      f"archive of {len(archive)} programs, mean {mean_code:.0f} chars"
      f" ({rejected} variants rejected as duplicates while filling)"
  )
  print(f"fill {args.size} adds + stats: {fill_s:.1f} s")
  print(f"add at size {len(archive)}: {add_s * 1e3:.1f} ms")
  print(f"renamed copy rejected in {dup_s * 1e3:.1f} ms")
  print(f"replay(8): {replay_s * 1e3:.1f} ms")
  print(f"prompt_examples(4): {examples_s * 1e3:.1f} ms")
  print(
      f"metrics (diversity {metrics['memory/diversity']:.3f}):"
      f" {metrics_s * 1e3:.1f} ms"
  )
  print(f"state_dict+json: {state_s * 1e3:.0f} ms, {len(text) / 1e6:.2f} MB")
  print(f"from_state_dict: {restore_s:.2f} s")
  print(f"builtin corpus: {len(corpus)} documents in {corpus_s:.2f} s")
  print(f"corpus.sample(24): {sample_s * 1e3:.2f} ms")
  print(
      f"memory_size={len(archive)} add_ms={add_s * 1e3:.1f}"
      f" duplicate_ms={dup_s * 1e3:.1f} replay_ms={replay_s * 1e3:.1f}"
      f" metrics_ms={metrics_s * 1e3:.1f} state_mb={len(text) / 1e6:.2f}"
      f" restore_s={restore_s:.2f} corpus_build_s={corpus_s:.2f}"
      f" corpus_sample_ms={sample_s * 1e3:.2f}"
  )


if __name__ == "__main__":
  main()
