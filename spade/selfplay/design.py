"""Design: grounding + memory -> prompts -> programs -> verdicts -> hints.

`design` samples the iteration's programs with the designer head, extracts
their code, validates them in the sandbox (an invalid one is sampled again
from the same prompt, up to `designer.max_attempts`, as the reference does),
writes hints for the valid ones (before archiving, so a replay keeps them),
archives them (near-duplicates rejected) and returns frozen `Design`s.
"""

from __future__ import annotations

import dataclasses
import time
import types
from typing import Any

from absl import logging
import ml_collections
import numpy as np

from spade import config as config_lib
from spade import console
from spade.designer import design_prompts
from spade.designer import extract
from spade.designer import skills as skills_lib
from spade.environments import audit as audit_lib
from spade.selfplay import records
from spade.selfplay.seeding import seed_for
from spade.train import modes


@dataclasses.dataclass(frozen=True)
class Designed:
  """The design phase's products: designs, its timings, its metrics."""

  designs: list[records.Design]
  timings: records.Timings
  metrics: dict[str, float]


def fit(ids: list[int], budget: int, bos: int) -> list[int]:
  """ids cut from the left to `budget`, keeping a leading BOS."""
  if len(ids) <= budget:
    return ids
  if ids and ids[0] == bos:
    return [bos] + ids[len(ids) - budget + 1 :]
  return ids[-budget:]


_WARNED_PROMPT_CUT: set[int] = set()


# The document a grounded prompt is rendered with by `check_prompt_budget`.
_EMPTY_DOCUMENT = types.SimpleNamespace(id=None, title="", text=".")


def designer_prompt(
    config: ml_collections.ConfigDict, engine, doc, examples, parent, spec
) -> list[int]:
  """Renders a designer prompt within the designer's prompt budget
  (`engine.prompt_budget("designer")`, the one rule).

  Memory examples are dropped (the last, least important, first), then the
  grounding document is halved until it fits; only a budget that cannot hold
  the instructions themselves cuts them (from the left, keeping BOS), with a
  warning.
  """
  budget = engine.prompt_budget("designer")
  examples = list(examples)
  while True:
    ids = engine.render(
        design_prompts.designer_messages(
            doc,
            examples,
            parent,
            family=spec.family,
            skill=spec.skill,
            difficulty=spec.difficulty,
            seed=spec.seed,
            max_turns=config.agent.max_turns,
            program_hint=config.designer.hint_source == "program",
            example=config.designer.prompt_example,
        )
    )
    if len(ids) <= budget:
      return ids
    if examples:
      examples.pop()
    elif doc is not None and len(doc.text) > 200:
      doc = dataclasses.replace(doc, text=doc.text[: len(doc.text) // 2])
    else:
      # Last resort (tiny models): the cut happens once, here, so the
      # sampler and the trainer both see exactly these ids.
      if budget not in _WARNED_PROMPT_CUT:
        logging.warning(
            "the designer's instructions take %d tokens, over its prompt"
            " budget of %d (designer.max_prompt_tokens, model.max_len -"
            " designer.max_new_tokens): cutting them from the left",
            len(ids),
            budget,
        )
        _WARNED_PROMPT_CUT.add(budget)
      return fit(ids, budget, engine.tokenizer.bos_id)


def check_prompt_budget(config: ml_collections.ConfigDict, engine) -> None:
  """Refuses, at start, a designer prompt budget that would cut the
  instructions (`designer.prompt_overflow="refuse"`, the default).

  Renders every configured skill's and difficulty's designer prompt with an
  empty grounding document and no memory examples (what `designer_prompt`
  keeps last) and raises a `ConfigError` (one line from `spade.main`)
  naming the keys when the longest is
  over `engine.prompt_budget("designer")`: a model shown a prompt cut from
  the left sees text that starts mid-sentence, without its task. Longer
  documents and examples are shortened to fit at run time, never cut.
  """
  c = config
  if not modes.get(c).designs or c.designer.prompt_overflow != "refuse":
    return
  budget = engine.prompt_budget("designer")
  doc = _EMPTY_DOCUMENT if c.grounding.enabled else None
  longest, where = 0, None
  family = c.designer.prompt_family
  skills = (
      c.designer.tool_use_skills
      if family in skills_lib.TOOL_FAMILIES
      else c.designer.skills
  )
  for skill in skills:
    for difficulty in c.designer.difficulties:
      ids = engine.render(
          design_prompts.designer_messages(
              doc,
              family=family,
              skill=skill,
              difficulty=difficulty,
              max_turns=c.agent.max_turns,
              program_hint=c.designer.hint_source == "program",
              example=c.designer.prompt_example,
          )
      )
      if len(ids) > longest:
        longest, where = len(ids), (skill, difficulty)
  if longest > budget:
    raise config_lib.ConfigError(
        f"the designer's instructions take {longest} tokens ({where[0]},"
        f" {where[1]}), over the designer's prompt budget of {budget}"
        f" (designer.max_prompt_tokens={c.designer.max_prompt_tokens},"
        f" model.max_len={c.model.max_len} -"
        f" designer.max_new_tokens={c.designer.max_new_tokens}): raise"
        " designer.max_prompt_tokens and model.max_len, or set"
        " designer.prompt_overflow=cut_left to cut them from the left"
    )


def write_hints(
    config: ml_collections.ConfigDict,
    engine,
    it: int,
    codes: list[str],
    verdicts: list[records.Verdict],
) -> tuple[list[records.Verdict], records.Timings]:
  """Verdicts of valid programs with a written hint where one is needed.

  `designer.hint_source="writer"` (the reference: a separate hint pass for
  every program) writes one for each valid program; "program" (ours) only
  for programs without their own `hint()`.
  """
  c = config
  writer = c.designer.hint_source == "writer"
  need = [
      i
      for i, v in enumerate(verdicts)
      if v.valid and (writer or not v.has_hint)
  ]
  if not need:
    return verdicts, records.Timings()
  console.say("iteration %d: writing %d hints", it + 1, len(need))
  # A hint may take up to half the context (the reference's 4096 tokens
  # need a long one); its prompt, the program's code, gets the rest.
  max_new = min(c.designer.hint_max_new_tokens, c.model.max_len // 2)
  budget = c.model.max_len - max_new
  t = time.perf_counter()
  outs = engine.sample(
      [
          fit(
              engine.render(design_prompts.hint_messages(codes[i])),
              budget,
              engine.tokenizer.bos_id,
          )
          for i in need
      ],
      role="designer",
      max_new_tokens=max_new,
      temperature=c.designer.hint_temperature,
      top_k=c.designer.hint_top_k,
      top_p=c.designer.hint_top_p,
      seed=seed_for(c.seed, it, "hint"),
      progress=f"iteration {it + 1}: hint writer",
  )
  timings = records.Timings(sampling=time.perf_counter() - t)
  out = list(verdicts)
  for i, (_, _, text) in zip(need, outs):
    out[i] = out[i].with_hint(extract.clean_hint(text, c.designer.hint_parse))
  return out, timings


def solvability_audit(
    config: ml_collections.ConfigDict,
    engine,
    it: int,
    attempt: int,
    codes: list[str],
    verdicts: list[records.Verdict],
) -> tuple[list[records.Verdict], records.Timings]:
  """`designer.audit`: the reference's model-based audit of the valid
  programs (`spade.environments.audit`), answered by the designer role; a
  "no" refuses the program (reason "env_validator"), so it is sampled again.
  A chat over the prompt budget is not asked and keeps its program, as the
  reference keeps one whose audit fails."""
  c = config
  need = [i for i, v in enumerate(verdicts) if v.valid]
  if not c.designer.audit or not need:
    return verdicts, records.Timings()
  max_new = min(c.designer.audit_max_new_tokens, c.model.max_len // 2)
  budget = c.model.max_len - max_new

  def generate(chats):
    ids = [engine.render(chat) for chat in chats]
    fits = [k for k, x in enumerate(ids) if len(x) <= budget]
    outs = (
        engine.sample(
            [ids[k] for k in fits],
            role="designer",
            max_new_tokens=max_new,
            temperature=c.designer.audit_temperature,
            top_k=c.designer.hint_top_k,
            top_p=c.designer.hint_top_p,
            seed=seed_for(c.seed, it, "audit", attempt),
            progress=f"iteration {it + 1}: solvability audit",
        )
        if fits
        else []
    )
    replies = [None] * len(chats)
    for k, (_, _, text) in zip(fits, outs):
      replies[k] = text
    return replies

  t = time.perf_counter()
  results = audit_lib.audit(
      [codes[i] for i in need],
      generate,
      tool_use=c.designer.prompt_family.startswith("tool_use"),
  )
  out = list(verdicts)
  for i, (keep, reply) in zip(need, results):
    if not keep:
      out[i] = out[i].rejected(
          audit_lib.REASON, audit_lib.refusal_message(reply)
      )
  return out, records.Timings(sampling=time.perf_counter() - t)


@dataclasses.dataclass(frozen=True)
class _Row:
  """One design's prompt and what it was built from."""

  ids: list[int]
  group: int  # skill group: the reference centres designer rewards per skill
  doc: Any
  parent: Any
  examples: tuple[Any, ...]
  spec: Any

  @property
  def doc_id(self):
    return getattr(self.doc, "id", None)

  @property
  def parent_id(self):
    return getattr(self.parent, "id", None)


def _prompts(config, engine, state, it, count=None) -> list[_Row]:
  """The iteration's designer prompts, one row per sample: a new pool's,
  or `count` of them (a top-up)."""
  c = config
  group = max(1, c.designer.samples_per_prompt)
  if count is None:
    docs = state.documents(max(1, c.designer.num_envs // group))
  else:
    docs = state.documents(-(-count // group))
  rows: list[_Row] = []
  mutate = np.random.default_rng(seed_for(c.seed, it, "mutate"))
  skill_groups: dict[str, int] = {}
  for g, doc in enumerate(docs):
    parent = None
    if mutate.random() < c.memory.mutation_fraction:
      parent = state.mutation_parent(seed_for(c.seed, it, g))
    spec = design_prompts.pick_prompt(
        c.designer,
        iteration=it,
        index=g,
        seed=c.seed,
        regen_interval=c.designer.regeneration_interval,
    )
    examples = tuple(state.examples(doc, c.memory.num_examples, spec.skill))
    ids = designer_prompt(c, engine, doc, examples, parent, spec)
    skill = skill_groups.setdefault(spec.skill, len(skill_groups))
    rows.extend(
        _Row(ids, skill, doc, parent, examples, spec) for _ in range(group)
    )
  return rows if count is None else rows[:count]


def _fresh_prompts(config, engine, state, rows, todo) -> None:
  """Rows `todo` (sampled again) get their prompt drawn again, as the
  reference's corpus orchestrator builds it for every attempt: a new
  grounding document (`designer.fresh_document_per_attempt`; none without
  grounding) and the memory's examples retrieved again
  (`designer.fresh_examples_per_attempt`, `_augment_prompt_with_memory`)."""
  c = config
  new_doc = c.designer.fresh_document_per_attempt and state.corpus is not None
  new_examples = c.designer.fresh_examples_per_attempt
  if not (new_doc or new_examples):
    return
  docs = state.documents(len(todo)) if new_doc else [None] * len(todo)
  for i, doc in zip(todo, docs):
    r = rows[i]
    doc = doc if new_doc else r.doc
    examples = r.examples
    if new_examples:
      examples = tuple(state.examples(doc, c.memory.num_examples, r.spec.skill))
    rows[i] = dataclasses.replace(
        r,
        doc=doc,
        examples=examples,
        ids=designer_prompt(c, engine, doc, examples, r.parent, r.spec),
    )


def design(
    config: ml_collections.ConfigDict,
    engine,
    executor,
    state,
    it: int,
    *,
    count: int | None = None,
    hints: bool = True,
) -> Designed:
  """Samples, extracts, validates, hints and archives iteration `it`'s
  programs (see the module docstring).

  A new pool's programs by default; `count` programs to top up an open
  window (`designer.top_up`), whose prompts are made the same way, skill i
  the i-th active skill, as the reference's top-up generation cycles its
  skills from 0. `hints=False` writes no hint: a top-up is never played
  with one (the reference's hint phase runs at regeneration only).
  """
  c = config
  rows = _prompts(c, engine, state, it, count)
  prompts = [r.ids for r in rows]
  console.say(
      "iteration %d: designer sampling %d programs (up to %d tokens)",
      it + 1,
      len(prompts),
      c.designer.max_new_tokens,
  )
  samples: list = [None] * len(prompts)
  codes: list = [None] * len(prompts)
  verdicts: list = [None] * len(prompts)
  attempts = [0] * len(prompts)
  timings = records.Timings()
  todo = list(range(len(prompts)))
  for attempt in range(max(1, c.designer.max_attempts)):
    if not todo:
      break
    if attempt:
      _fresh_prompts(c, engine, state, rows, todo)
    t = time.perf_counter()
    outs = engine.sample(
        [rows[i].ids for i in todo],
        role="designer",
        max_new_tokens=c.designer.max_new_tokens,
        temperature=c.designer.temperature,
        top_k=c.designer.top_k,
        top_p=c.designer.top_p,
        seed=seed_for(c.seed, it, "designer", attempt),
        progress=f"iteration {it + 1}: designer sampling",
    )
    sampled = time.perf_counter() - t
    new_codes = [
        extract.extract_code(text, rule=c.designer.code_extraction)
        for _, _, text in outs
    ]
    t = time.perf_counter()
    with console.heartbeat(
        f"iteration {it + 1}: validating {len(new_codes)} programs in the"
        f" sandbox (attempt {attempt + 1})"
    ):
      new_verdicts = executor.validate(new_codes)
    timings += records.Timings(
        sampling=sampled, sandbox=time.perf_counter() - t
    )
    new_verdicts, audited = solvability_audit(
        c, engine, it, attempt, new_codes, new_verdicts
    )
    timings += audited
    for i, out, code, verdict in zip(todo, outs, new_codes, new_verdicts):
      samples[i], codes[i], verdicts[i] = out, code, verdict
      attempts[i] = attempt
    todo = [i for i in todo if not verdicts[i].valid]
  console.say(
      "iteration %d: %d/%d programs valid; reasons: %s",
      it + 1,
      sum(v.valid for v in verdicts),
      len(verdicts),
      ", ".join(sorted({v.reason for v in verdicts})),
  )
  hint_timings = records.Timings()
  if hints:
    verdicts, hint_timings = write_hints(c, engine, it, codes, verdicts)
  designs, duplicates = [], 0
  for i, (code, verdict) in enumerate(zip(codes, verdicts)):
    row = rows[i]
    entry_id, dup_of = state.archive_add(
        code, verdict, it, row.doc_id, parent=row.parent_id
    )
    if dup_of is not None:
      duplicates += 1
      # The reference has no duplicate filter: a copy is played and trained
      # like any design ("play"); the archive keeps the first one only.
      if c.designer.duplicates == "refuse":
        verdict = verdict.rejected("duplicate", f"near-duplicate of {dup_of}")
    designs.append(
        records.Design(
            index=i,
            group=row.group,
            prompt_ids=tuple(row.ids),
            completion_ids=tuple(samples[i][0]),
            logprobs=tuple(samples[i][1]),
            code=code,
            verdict=verdict,
            grounding_id=row.doc_id,
            parent_id=row.parent_id,
            archive_id=entry_id,
            skill=row.spec.skill,
            attempt=attempts[i],
        )
    )
  return Designed(
      designs,
      timings + hint_timings,
      {
          "memory/duplicates_this_iter": float(duplicates),
          "designer/mutations": float(sum(r.parent is not None for r in rows)),
          "designer/attempts_mean": float(np.mean(attempts)) + 1.0,
      },
  )
