r"""Share of valid environment programs a model writes from the designer prompts.

Samples `--designs` programs from the designer head of `--config` (default
Qwen2.5-Coder-0.5B-Instruct) with the default designer prompts, the way the
loop builds them: one grounding document per prompt from `config.grounding`
(none when grounding is off), (family, skill, difficulty) from
`spade.designer.prompts.pick_prompt`, no memory examples (an empty archive, as
at a run's start). Each program is extracted (`extract.extract_code`) and
validated in the sandbox pool of `config.sandbox` (gVisor by default). Prints
one line per batch (tokens, tok/s), then each design's verdict, the counts
by reason and the running total; the last line is:

  designs=N valid=V valid_frac=F near_copies=C distinct_valid=D

A valid design may be the prompt's own example program, renamed: C counts the
valid designs the archive's near-duplicate check (`spade.memory.dedup`, at
`memory.duplicate_threshold`) finds equal to one of the designer prompts'
example programs (`spade.designer.examples.BY_FAMILY`), and D the valid
designs an empty archive would keep (neither such a copy nor a near-duplicate
of a design kept before it). `--rescore DIR` prints these figures again for
the designs a run saved with `--save_dir=DIR`, without sampling.

Sampling uses the loop's designer settings (`designer.temperature`,
`designer.top_k`, `designer.top_p`) unless overridden. Prompts are left-padded
to a multiple of 128 tokens (not a power of two: a 2,300-token prompt would
otherwise be prefilled at 4,096) and `model.max_len` is raised to hold the
longest prompt plus `--max_new_tokens`. Run (several minutes on 2 CPU cores):

  python benchmarks/designer_validity.py
  python benchmarks/designer_validity.py --designs=4 --batch=4   # a probe
  python benchmarks/designer_validity.py --save_dir=/tmp/designs  # keep them
  python benchmarks/designer_validity.py --rescore=/tmp/designs
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import sys
import time

import jax
import numpy as np

from spade import config as config_lib
from spade import console
from spade import grounding
from spade.designer import examples
from spade.designer import extract
from spade.designer import prompts as designer_prompts
from spade.memory import dedup
from spade.model import loading
from spade.model import tokenizer as tokenizer_lib
from spade.model import transformer
from spade.sampling import sampler as sampler_lib
from spade.sandbox import pool as pool_lib

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PAD_TO = 128


def _log(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


def _load_config(spec: str):
  """Loads `path[:arg]` like absl's config flags (`get_config(arg)`)."""
  path, _, arg = spec.partition(":")
  if not os.path.isabs(path):
    path = os.path.join(_ROOT, path)
  module_spec = importlib.util.spec_from_file_location("_bench_config", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg or None)


def _parse(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--config", default="configs/qwen2p5_coder_0p5b.py")
  p.add_argument("--designs", type=int, default=32)
  p.add_argument("--batch", type=int, default=8, help="designs per call")
  p.add_argument("--max_new_tokens", type=int, default=1536)
  p.add_argument(
      "--prefill_chunk", type=int, default=128,
      help="prompt columns per prefill step (memory: batch 32 at 512 did not"
      " fit 24 GB)",
  )  # fmt: skip
  p.add_argument("--temperature", type=float, default=None)
  p.add_argument("--top_p", type=float, default=None)
  p.add_argument("--top_k", type=int, default=None)
  p.add_argument("--family", default=None, help="designer.prompt_family")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--iteration", type=int, default=0)
  p.add_argument("--save_dir", default="", help="write designs and verdicts")
  p.add_argument(
      "--rescore", default="",
      help="a --save_dir of an earlier run: print its figures, sample nothing",
  )  # fmt: skip
  return p.parse_args(argv)


def designer_prompts_for(config, n: int, seed: int, iteration: int):
  """The n designer prompts of one iteration: (messages, spec, document)."""
  docs = [None] * n
  if config.grounding.enabled:
    docs = grounding.build_corpus(config.grounding).sample(n)
  out = []
  for i, doc in enumerate(docs):
    spec = designer_prompts.pick_prompt(
        config.designer, iteration=iteration, index=i, seed=seed
    )
    messages = designer_prompts.designer_messages(
        doc,
        family=spec.family,
        skill=spec.skill,
        difficulty=spec.difficulty,
        seed=spec.seed,
        max_turns=config.agent.max_turns,
        program_hint=config.designer.hint_source == "program",
        example=config.designer.prompt_example,
    )
    out.append((messages, spec, doc))
  return out


def novelty(valid_codes: list[str], threshold: float) -> tuple[int, int]:
  """(near_copies, distinct_valid) of valid programs, in order (module doc)."""
  shown = [dedup.minhash(code) for code in examples.BY_FAMILY.values()]
  shown_prints = {dedup.ast_fingerprint(c) for c in examples.BY_FAMILY.values()}
  copies, kept, kept_prints = 0, [], set()
  for code in valid_codes:
    signature, fingerprint = dedup.minhash(code), dedup.ast_fingerprint(code)
    if (
        fingerprint in shown_prints
        or max(dedup.similarity(signature, np.stack(shown))) >= threshold
    ):
      copies += 1
      continue
    if fingerprint in kept_prints or (
        kept and max(dedup.similarity(signature, np.stack(kept))) >= threshold
    ):
      continue
    kept.append(signature)
    kept_prints.add(fingerprint)
  return copies, len(kept)


def summary(codes: list[str], verdicts: list[dict], threshold: float) -> str:
  """The last line: designs=N valid=V valid_frac=F near_copies=C ..."""
  valid = [c for c, v in zip(codes, verdicts) if v.get("valid")]
  copies, distinct = novelty(valid, threshold)
  return (
      f"designs={len(codes)} valid={len(valid)}"
      f" valid_frac={len(valid) / max(len(codes), 1):.3f}"
      f" near_copies={copies} distinct_valid={distinct}"
  )


def rescore(directory: str, threshold: float) -> None:
  """Prints the summary of the designs a `--save_dir` run wrote."""
  codes, verdicts = [], []
  for k in range(1000):
    stem = os.path.join(directory, f"design_{k:02d}")
    if not os.path.exists(stem + ".json"):
      break
    with open(stem + ".py") as f:
      codes.append(f.read())
    with open(stem + ".json") as f:
      verdicts.append(json.load(f))
  if not codes:
    raise SystemExit(
        f"--rescore={directory}: no design_00.json there; pass the"
        " --save_dir of a designer_validity run"
    )
  print(summary(codes, verdicts, threshold), flush=True)


def main(argv=None) -> None:
  console.no_tpu_probe()  # before JAX starts a backend: no libtpu page
  args = _parse(argv)
  config = _load_config(args.config)
  if args.rescore:
    rescore(args.rescore, config.memory.duplicate_threshold)
    return
  if args.family:
    config.designer.prompt_family = args.family
  config_lib.validate(config)
  temperature = (
      config.designer.temperature
      if args.temperature is None
      else args.temperature
  )
  top_k = config.designer.top_k if args.top_k is None else args.top_k
  top_p = config.designer.top_p if args.top_p is None else args.top_p

  start = time.perf_counter()
  tokenizer = tokenizer_lib.build_tokenizer(config)
  items = designer_prompts_for(config, args.designs, args.seed, args.iteration)
  ids = [
      tokenizer.encode(tokenizer.chat_prompt(m), add_bos=True)
      for m, _, _ in items
  ]
  longest = max(len(p) for p in ids)
  length = -(-longest // _PAD_TO) * _PAD_TO
  config.model.max_len = max(config.model.max_len, length + args.max_new_tokens)
  families = collections.Counter(
      designer_prompts.effective_family(s.family, d) for _, s, d in items
  )
  _log(
      f"{len(items)} prompts ({dict(families)}), {min(map(len, ids))}-"
      f"{longest} tokens (padded to {length}); max_new_tokens="
      f"{args.max_new_tokens}, temperature={temperature}, top_k={top_k},"
      f" top_p={top_p}; model.max_len={config.model.max_len}"
  )
  params = loading.initial_params(config, jax.random.PRNGKey(config.seed))
  sampler = sampler_lib.Sampler(
      *transformer.sampling_fns(config.model, transformer.Role.DESIGNER),
      pad_id=tokenizer.pad_id,
      stop_ids=tuple(tokenizer.stop_ids),
      prefill_chunk=args.prefill_chunk,
  )
  _log(f"model ready in {time.perf_counter() - start:.0f}s")

  texts, new_tokens, finished, codes, verdicts = [], [], [], [], []
  reasons = collections.Counter()
  total_tokens, total_s = 0, 0.0
  batches = range(0, len(ids), args.batch)
  if args.save_dir:
    os.makedirs(args.save_dir, exist_ok=True)
  with pool_lib.SandboxPool.from_config(config.sandbox) as pool:
    for b, lo in enumerate(batches):
      rows = ids[lo : lo + args.batch]
      n = len(rows)
      # Filler rows keep one compiled batch shape for a short last batch.
      rows = rows + [rows[-1]] * (args.batch - n)
      prompts, lengths = sampler_lib.left_pad(rows, length, tokenizer.pad_id)
      t = time.perf_counter()
      out = sampler(
          params,
          prompts,
          lengths,
          max_new_tokens=args.max_new_tokens,
          rng=jax.random.PRNGKey(args.seed * 1000 + b),
          temperature=temperature,
          top_k=top_k,
          top_p=top_p,
      )
      seconds = time.perf_counter() - t
      total_tokens += int(np.sum(out.lengths))
      total_s += seconds
      _log(
          f"batch {b + 1}/{len(batches)}: {int(np.sum(out.lengths[:n]))}"
          f" tokens for {n} designs in {seconds:.0f}s"
          f" ({int(np.sum(out.lengths)) / seconds:.1f} tok/s incl. prefill of"
          f" {len(rows)}x{length}); done {lo + n}/{len(ids)}"
      )
      batch_texts = [
          tokenizer.decode(out.tokens[i, : out.lengths[i]].tolist())
          for i in range(n)
      ]
      batch_codes = [extract.extract_code(t) for t in batch_texts]
      # Validated batch by batch, so a run stopped early still has figures.
      batch_verdicts = pool.validate(batch_codes)
      for i, verdict in enumerate(batch_verdicts):
        k = lo + i
        _, spec, doc = items[k]
        texts.append(batch_texts[i])
        codes.append(batch_codes[i])
        verdicts.append(verdict)
        new_tokens.append(int(out.lengths[i]))
        finished.append(bool(out.finished[i]))
        reason = verdict.get("reason", "?")
        reasons[reason] += 1
        cut = "" if finished[k] else " CUT-OFF"
        message = " ".join(str(verdict.get("message", "")).split())[:160]
        print(
            f"design {k:2d}"
            f" {designer_prompts.effective_family(spec.family, doc)}"
            f"/{spec.skill}/{spec.difficulty}"
            f" doc={getattr(doc, 'title', None)!r}"
            f" tokens={new_tokens[k]}{cut}:"
            f" {'VALID' if verdict.get('valid') else 'invalid'} [{reason}]"
            f" {message}",
            flush=True,
        )
        if args.save_dir:
          stem = os.path.join(args.save_dir, f"design_{k:02d}")
          with open(stem + ".txt", "w") as f:
            f.write(batch_texts[i])
          with open(stem + ".py", "w") as f:
            f.write(batch_codes[i])
          with open(stem + ".json", "w") as f:
            json.dump(verdict, f, indent=1, default=str)
      print(
          f"sampling: {total_tokens} tokens in {total_s:.0f}s"
          f" ({total_tokens / max(total_s, 1e-9):.1f} tok/s incl. prefill and"
          f" filler rows); cut off at max_new_tokens:"
          f" {sum(not f for f in finished)}/{len(finished)}"
      )
      print(
          "reasons: " + ", ".join(f"{r}={c}" for r, c in reasons.most_common())
      )
      print(
          summary(codes, verdicts, config.memory.duplicate_threshold),
          flush=True,
      )


if __name__ == "__main__":
  main()
