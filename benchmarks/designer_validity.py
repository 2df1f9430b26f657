r"""Share of valid environment programs a model writes from the designer prompts.

Samples `--designs` programs from the designer head of `--config` (default
Qwen2.5-Coder-0.5B-Instruct) with the designer prompts the loop builds at a
run's start: one grounding document per prompt from `config.grounding`
(none when grounding is off), (family, skill, difficulty) from
`spade.designer.design_prompts.pick_prompt`, and the memory examples the
reference's retrieval shows from `memory.seed_dir` (none with an empty memory,
as at a run's start without it). Sampling runs through the slot engine the loop uses
(`config.sampling.*`; a finished design frees its slot for the next). Each
program is extracted (`extract.extract_code`) and validated in the sandbox
pool of `config.sandbox` (gVisor by default); a design still invalid is
sampled again, with a fresh document when the loop would draw one, up to
`designer.max_attempts` times (the loop's rule). Prints each design's
verdict, the counts by reason, the sampling rate, seconds per design, and
last:

  designs=N valid=V valid_frac=F near_copies=C distinct_valid=D

V counts designs valid within their attempts. C counts the valid designs
that the archive's near-duplicate check (`spade.memory.dedup`, at
`memory.duplicate_threshold`) finds equal to a program the model was shown
or could have learned: the prompts' example programs
(`spade.designer.examples`), the seed library, the bundled pools, the
`memory.seed_dir` and `train.warm_start_dir` programs. D counts the valid
designs an empty archive would keep: not such a copy, nor a near-duplicate
of a design kept before it. `--rescore DIR` prints these figures again for
the designs a run saved with `--save_dir=DIR`, without sampling.

Every lever is a config key, set with `--set key=value` (repeatable), so
the figures are those of a run with the same keys:

  python benchmarks/designer_validity.py                         # default
  python benchmarks/designer_validity.py --set designer.max_attempts=1
  python benchmarks/designer_validity.py --set memory.seed_dir=library
  python benchmarks/designer_validity.py \
      --config=configs/qwen2p5_coder_1p5b.py:runlocal
  python benchmarks/designer_validity.py --designs=4 --slots=4   # a probe
  python benchmarks/designer_validity.py --save_dir=/tmp/designs  # keep them
  python benchmarks/designer_validity.py --rescore=/tmp/designs
"""

from __future__ import annotations

import argparse
import ast
import collections
import json
import os
import sys
import time

import jax
import numpy as np

from spade import config as config_lib
from spade import console
from spade.designer import design_prompts
from spade.designer import examples
from spade.designer import extract
from spade.environments import library
from spade.environments import sandboxes
from spade.memory import dedup
from spade.model import layout
from spade.model import loading
from spade.model import tokenizer as tokenizer_lib
from spade.model import transformer
from spade.sampling import slot_engine
from spade.sampling import slot_server
from spade.selfplay import state as state_lib
from spade.selfplay import design as design_lib
from spade.selfplay import engine as engine_lib

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _log(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


def _load_config(spec: str, overrides=()):
  """Loads `path[:arg]` like absl's config flags (`get_config(arg)`), then
  applies `key=value` overrides as `--config.key=value` would."""
  config = config_lib.load_file(spec, _ROOT)
  for item in overrides:
    key, sep, text = item.partition("=")
    if not sep:
      raise SystemExit(f"--set {item!r}: write key=value")
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      value = text  # a bare string
    *parents, leaf = key.split(".")
    node = config
    for name in parents:
      node = node[name]
    if leaf not in node:
      raise SystemExit(f"--set {item!r}: the config has no key {key!r}")
    node[leaf] = value
  return config


def _parse(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--config", default="configs/qwen2p5_coder_1p5b.py:runlocal")
  p.add_argument(
      "--set", action="append", default=[], metavar="KEY=VALUE",
      help="a config override, as --config.KEY=VALUE (repeatable)",
  )  # fmt: skip
  p.add_argument("--designs", type=int, default=32)
  p.add_argument(
      "--slots", type=int, default=8,
      help="decode slots (designs sampled at once); 0: sampling.slots",
  )  # fmt: skip
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--iteration", type=int, default=0)
  p.add_argument("--save_dir", default="", help="write designs and verdicts")
  p.add_argument(
      "--rescore", default="",
      help="a --save_dir of an earlier run: print its figures, sample nothing",
  )  # fmt: skip
  return p.parse_args(argv)


def designer_prompts_for(config, renderer, state, n: int, seed: int, it: int):
  """The n designer prompts of iteration `it`, as the loop renders them:
  [(ids, spec, document, examples)]."""
  c = config
  docs = state.documents(n) if state.corpus is not None else [None] * n
  out = []
  for i, doc in enumerate(docs):
    spec = design_prompts.pick_prompt(
        c.designer, iteration=it, index=i, seed=seed
    )
    shown = tuple(state.examples(doc, c.memory.num_examples, spec.skill))
    ids = design_lib.designer_prompt(c, renderer, doc, shown, None, spec)
    out.append((ids, spec, doc, shown))
  return out


def shown_programs(config) -> list[str]:
  """Every program the model was shown or could have learned before it
  designs: the prompts' examples, the seed library, the bundled pools and
  the `memory.seed_dir` and `train.warm_start_dir` programs."""
  codes = list(examples.BY_FAMILY.values())
  codes += [p.source for p in library.seed_programs()]
  folders = [
      os.path.join(os.path.dirname(library.__file__), "pools", name)
      for name in ("easy", "trivial")
  ]
  if config.train.warm_start_dir:
    folders.append(config.train.warm_start_dir)
  if config.memory.seed_dir and config.memory.seed_dir != "library":
    folders.append(config.memory.seed_dir)
  for folder in folders:
    for name in sorted(os.listdir(folder)):
      if name.endswith(".py"):
        with open(os.path.join(folder, name)) as f:
          codes.append(f.read())
  return codes


def novelty(
    valid_codes: list[str], shown: list[str], threshold: float
) -> tuple[int, int]:
  """(near_copies, distinct_valid) of valid programs, in order (module doc)."""
  signatures = np.stack([dedup.minhash(code) for code in shown])
  shown_prints = {dedup.ast_fingerprint(c) for c in shown}
  copies, kept, kept_prints = 0, [], set()
  for code in valid_codes:
    signature, fingerprint = dedup.minhash(code), dedup.ast_fingerprint(code)
    if (
        fingerprint in shown_prints
        or max(dedup.similarity(signature, signatures)) >= threshold
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


def summary(codes, verdicts, shown, threshold: float) -> str:
  """The last line: designs=N valid=V valid_frac=F near_copies=C ..."""
  valid = [c for c, v in zip(codes, verdicts) if v.get("valid")]
  copies, distinct = novelty(valid, shown, threshold)
  return (
      f"designs={len(codes)} valid={len(valid)}"
      f" valid_frac={len(valid) / max(len(codes), 1):.3f}"
      f" near_copies={copies} distinct_valid={distinct}"
  )


def rescore(config, directory: str) -> None:
  """Prints the summary of the designs a `--save_dir` run wrote."""
  codes, verdicts = [], []
  # Designs are saved as they finish, so a stopped run may have gaps.
  names = sorted(
      name[: -len(".json")]
      for name in (os.listdir(directory) if os.path.isdir(directory) else ())
      if name.startswith("design_") and name.endswith(".json")
  )
  for name in names:
    stem = os.path.join(directory, name)
    with open(stem + ".py") as f:
      codes.append(f.read())
    with open(stem + ".json") as f:
      verdicts.append(json.load(f))
  if not codes:
    raise SystemExit(
        f"--rescore={directory}: no design_*.json there; pass the"
        " --save_dir of a designer_validity run"
    )
  threshold = config.memory.duplicate_threshold
  print(summary(codes, verdicts, shown_programs(config), threshold))


def main(argv=None) -> None:
  console.no_tpu_probe()  # before JAX starts a backend: no libtpu page
  args = _parse(argv)
  config = _load_config(args.config, args.set)
  if args.rescore:
    rescore(config, args.rescore)
    return
  config_lib.validate(config)
  c = config
  threshold = c.memory.duplicate_threshold
  start = time.perf_counter()
  tokenizer = tokenizer_lib.build_tokenizer(c)
  renderer = engine_lib.PromptRenderer(c, tokenizer)
  design_lib.check_prompt_budget(c, renderer)
  state = state_lib.LoopState.create(c)  # the corpus cursor and seeded memory
  items = designer_prompts_for(
      c, renderer, state, args.designs, args.seed, args.iteration
  )
  families = collections.Counter(
      design_prompts.effective_family(spec.family, doc)
      for _, spec, doc, _ in items
  )
  lengths = [len(ids) for ids, _, _, _ in items]
  shown_counts = collections.Counter(len(e) for _, _, _, e in items)
  _log(
      f"{len(items)} prompts ({dict(families)}), {min(lengths)}-"
      f"{max(lengths)} tokens, memory examples per prompt"
      f" {dict(shown_counts)}; max_new_tokens={c.designer.max_new_tokens},"
      f" temperature={c.designer.temperature}, top_k={c.designer.top_k},"
      f" top_p={c.designer.top_p}, attempts={c.designer.max_attempts},"
      f" prompt_example={c.designer.prompt_example},"
      f" seed_dir={c.memory.seed_dir!r}"
  )
  params = loading.initial_params(c, jax.random.PRNGKey(c.seed))
  if not c.model.scan_decode:
    # The decoding layout only (the engine's `decode_params`): no stacked
    # copy held beside it.
    params = layout.unstack_releasing(layout.owned(params), c.model)
  num_slots = args.slots or c.sampling.slots
  fns = transformer.sampling_fns(c.model, transformer.Role.DESIGNER)
  engine = slot_engine.SlotEngine(
      fns.tokens_to_logits,
      fns.init_cache,
      fns.prepare_params,
      pad_id=int(tokenizer.pad_id),
      stop_ids=tuple(int(i) for i in tokenizer.stop_ids),
      slots=num_slots,
      cache_length=c.model.max_len,
      prefill_chunk=c.sampling.prefill_chunk,
      prefill_rows=min(c.sampling.prefill_rows, num_slots),
      decode_steps=c.sampling.decode_steps,
      min_rows=c.sampling.min_rows,
      max_gathered_rows=c.sampling.max_gathered_rows,
      temperature=c.designer.temperature,
      top_k=c.designer.top_k,
      top_p=c.designer.top_p,
  )
  _log(f"model ready in {time.perf_counter() - start:.0f}s")

  n = len(items)
  codes, verdicts = [None] * n, [None] * n
  texts, tokens, attempts = [None] * n, [0] * n, [0] * n
  reasons = collections.Counter()
  total_tokens, total_s, samples = 0, 0.0, 0
  if args.save_dir:
    os.makedirs(args.save_dir, exist_ok=True)

  def report(k: int) -> None:
    """Prints design k's final verdict and saves it under --save_dir."""
    _, spec, doc, shown = items[k]
    verdict = verdicts[k]
    reasons[verdict.get("reason", "?")] += 1
    cut = "" if tokens[k] < c.designer.max_new_tokens else " CUT-OFF"
    message = " ".join(str(verdict.get("message", "")).split())[:160]
    print(
        f"design {k:2d}"
        f" {design_prompts.effective_family(spec.family, doc)}"
        f"/{spec.skill}/{spec.difficulty} examples={len(shown)}"
        f" attempts={attempts[k]} tokens={tokens[k]}{cut}:"
        f" {'VALID' if verdict.get('valid') else 'invalid'}"
        f" [{verdict.get('reason', '?')}] {message}",
        flush=True,
    )
    if args.save_dir:
      stem = os.path.join(args.save_dir, f"design_{k:02d}")
      with open(stem + ".txt", "w") as f:
        f.write(texts[k])
      with open(stem + ".py", "w") as f:
        f.write(codes[k])
      with open(stem + ".json", "w") as f:
        json.dump(verdict, f, indent=1, default=str)

  todo = list(range(n))
  prompts = [ids for ids, _, _, _ in items]
  attempts_allowed = max(1, c.designer.max_attempts)
  with sandboxes.from_config(c.sandbox) as pool:
    for attempt in range(attempts_allowed):
      if not todo:
        break
      if attempt and c.designer.fresh_document_per_attempt and state.corpus:
        for k, doc in zip(todo, state.documents(len(todo))):
          _, spec, _, shown = items[k]
          prompts[k] = design_lib.designer_prompt(
              c, renderer, doc, shown, None, spec
          )
          items[k] = (prompts[k], spec, doc, shown)
      server = slot_server.TextServer(
          slot_server.SlotServer(engine, params),
          tokenizer,
          c.designer.max_new_tokens,
      )
      for k in todo:
        server.submit(k, prompts[k], args.seed * 1000 + attempt, 0)
      t = time.perf_counter()
      ticker = console.Ticker(
          f"attempt {attempt + 1}: {len(todo)} designs",
          total=len(todo) * c.designer.max_new_tokens,
      )
      valid_now = 0
      while server.busy:
        done = [(k, ids, text) for k, ids, _, text in server.step()]
        ticker.update(server.tokens_generated, rows=len(todo))
        if not done:
          continue
        # Each design is validated, printed and saved as it finishes, so a
        # stopped run keeps what it sampled (`--rescore` reads it back).
        batch = [
            extract.extract_code(text, rule=c.designer.code_extraction)
            for _, _, text in done
        ]
        for (k, ids, text), code, verdict in zip(
            done, batch, pool.validate(batch)
        ):
          codes[k], verdicts[k], texts[k] = code, verdict, text
          tokens[k], attempts[k] = len(ids), attempt + 1
          valid_now += bool(verdict.get("valid"))
          if verdict.get("valid") or attempt + 1 == attempts_allowed:
            report(k)
      ticker.close(server.tokens_generated, f", {len(todo)} designs")
      seconds = time.perf_counter() - t
      total_s += seconds
      total_tokens += server.tokens_generated
      samples += len(todo)
      _log(
          f"attempt {attempt + 1}: {server.tokens_generated} tokens in"
          f" {seconds:.0f}s ({server.tokens_generated / seconds:.1f} tok/s),"
          f" {valid_now}/{len(todo)} valid"
      )
      todo = [k for k in todo if not verdicts[k].get("valid")]
  print(
      f"sampling: {samples} samples for {n} designs, {total_tokens} tokens"
      f" in {total_s:.0f}s ({total_tokens / max(total_s, 1e-9):.1f} tok/s,"
      f" {total_s / n:.1f} s per design, {num_slots} slots)"
  )
  print("reasons: " + ", ".join(f"{r}={k}" for r, k in reasons.most_common()))
  print(summary(codes, verdicts, shown_programs(c), threshold), flush=True)


if __name__ == "__main__":
  main()
