"""The policy: weights, sampling per role, the update.

`Engine` owns the train state (params, optimizer state, step, rng) on the
mesh and offers the host loop a few calls (the sandbox side, validation and
environment calls, is `spade.selfplay.executor.Executor`):

  render(messages)          chat messages -> prompt token ids
  sample(prompts, role,..)  a batch of prompts -> [(ids, logprobs, text)]
  agent_server(...)         the slot engine's server for the agent head
  extend(messages, ...)     the ids between a reply and the next prompt
  prompt_budget(role)       the one prompt-length rule per role
  update(agent_rows, designer_rows)  one shared update step
  warm_start(seeds, steps)  supervised stage on the seed library

Sampling runs as one SPMD program over the global mesh: every process builds
the same global prompt batch (the programs and histories are identical on all
processes), the sampler's outputs are gathered back to every host. It runs
through the slot engine (`spade.sampling.slot_server`): the rollout's
episodes as requests of their own (`agent_server`), and `sample`'s prompts
(the designer's programs, the hint writer) as a queue of requests.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from absl import logging
import jax
import ml_collections
import numpy as np

from spade import config as config_lib
from spade import console
from spade.agent import prompts as agent_prompts
from spade.environments import library
from spade.model import architecture
from spade.model import layout
from spade.model import loading
from spade.model import sharding
from spade.model import tokenizer as tokenizer_lib
from spade.model import transformer
from spade.sampling import shapes
from spade.sampling import slot_engine
from spade.sampling import slot_server
from spade.sampling import text
from spade.selfplay import batching
from spade.train import state as state_lib
from spade.train import update as update_lib


def render(tokenizer, messages: list[dict[str, str]]) -> list[int]:
  """Chat messages -> token ids in the tokenizer's chat format, as the loop
  renders every prompt."""
  return tokenizer.encode(tokenizer.chat_prompt(messages), add_bos=True)


def prompt_budget(config: ml_collections.ConfigDict, role: str) -> int:
  """The prompt tokens a `role` reply may be sampled from (one rule)."""
  c = config
  if role == "agent":
    return agent_prompts.prompt_budget(
        c.agent.max_context, c.model.max_len, c.agent.max_new_tokens
    )
  if role == "designer":
    return agent_prompts.prompt_budget(
        c.designer.max_prompt_tokens,
        c.model.max_len,
        c.designer.max_new_tokens,
    )
  raise ValueError(f"unknown role {role!r}; 'agent' or 'designer'")


class PromptRenderer:
  """The engine's prompt side alone (`render`, `prompt_budget`), for code
  that builds the loop's prompts without a model: benchmarks, tests."""

  def __init__(self, config: ml_collections.ConfigDict, tokenizer):
    self.config = config
    self.tokenizer = tokenizer

  def render(self, messages: list[dict[str, str]]) -> list[int]:
    return render(self.tokenizer, messages)

  def prompt_budget(self, role: str) -> int:
    return prompt_budget(self.config, role)


class Engine:
  """Model, tokenizer, samplers and update step for one run (the sandbox
  pool is `spade.selfplay.executor.Executor`'s)."""

  def __init__(self, config: ml_collections.ConfigDict):
    self.config = config
    self.mesh = sharding.make_mesh(config.mesh)
    self.rules = tuple(tuple(r) for r in config.mesh.rules)
    self.tokenizer = tokenizer_lib.build_tokenizer(config)
    self.model = transformer.build_model(config.model)
    rng = jax.random.PRNGKey(config.seed)
    if config.checkpoint.kind == "scratch":
      # Created in its shards: no device ever holds a whole copy.
      params = sharding.init_sharded_params(
          config.model, rng, self.mesh, self.rules
      )
    else:
      # Each tensor placed in its shards as it is read.
      with console.heartbeat(f"loading {config.checkpoint.kind} checkpoint"):
        params = loading.initial_params(config, rng, self.mesh, self.rules)
    self.optimizer = state_lib.make_optimizer(config.optim)
    self._decoding = None  # the stacked shardings while params are unstacked
    self.state = state_lib.create_state(
        params,
        self.optimizer,
        rng=jax.random.fold_in(rng, 1),
        mesh=self.mesh,
        rules=self.rules,
        keep_reference=state_lib.keeps_reference(config),
        lora_rank=config.optim.lora_rank,
    )
    self.update_step = update_lib.make_update_step(
        self.model, self.optimizer, self.mesh, config
    )
    self._sft_step = None
    self.generator = text.TextGenerator(
        config.model,
        self.tokenizer,
        mesh=self.mesh,
        rules=self.rules,
        prefill_chunk=config.sampling.prefill_chunk,
    )
    self._slot_engines: dict[tuple[Any, ...], slot_engine.SlotEngine] = {}
    # What every slot server of the run took in (`prefill_counts`).
    self.prompt_counts = slot_server.PromptCounts()

  # -- the parameters' two layouts -------------------------------------------

  @property
  def state(self) -> state_lib.TrainState:
    """The train state, its parameters in the model's (stacked) layout."""
    if self._decoding is not None:
      params = layout.owned(self._state.params)
      self._state = dataclasses.replace(self._state, params=None)
      params = layout.restack_releasing(
          params, self.config.model, self._decoding
      )
      _place_releasing(params, self._decoding)
      self._state = dataclasses.replace(self._state, params=params)
      self._decoding = None
    return self._state

  @state.setter
  def state(self, value: state_lib.TrainState) -> None:
    self._state = value
    self._decoding = None

  def decode_params(self):
    """The parameters in the samplers' decoding layout (one subtree per
    layer, `transformer.sampling_fns`), made from the stacked ones when a
    sampler first asks after an update and kept until `state` is read.

    The train state then holds them in that layout instead of the stacks,
    each stack freed as its layers are sliced out
    (`layout.unstack_releasing`): sampling holds one copy of the weights,
    not the stacks plus the samplers' unstacked copy (the 1.5B's layers:
    4.3 GB). With `model.scan_decode` the stacks are decoded as they are.
    """
    if self.config.model.scan_decode or self._decoding is not None:
      return self._state.params
    stacked = self._state.params
    shardings = jax.tree.map(lambda x: x.sharding, stacked)
    params = layout.owned(stacked)
    del stacked
    self._state = dataclasses.replace(self._state, params=None)
    params = layout.unstack_releasing(params, self.config.model)
    # The tables and the MLP's kernels move to their decoding split
    # (`layers.DECODE_PARAM_AXES`), one leaf held twice at a time.
    _place_releasing(
        params, sharding.fitted_param_shardings(params, self.mesh, self.rules)
    )
    self._state = dataclasses.replace(self._state, params=params)
    self._decoding = shardings
    return params

  # -- text -------------------------------------------------------------------

  def render(self, messages: list[dict[str, str]]) -> list[int]:
    """Chat messages -> token ids in the checkpoint's chat format."""
    return render(self.tokenizer, messages)

  def extend(
      self,
      messages: list[dict[str, str]],
      reply: str,
      after: list[dict[str, str]],
  ) -> list[int] | None:
    """The ids the chat format puts after `reply` to reach `after`'s prompt.

    `after` is `messages` plus the reply and what the environment answered;
    its rendered prompt must start with `messages`' prompt followed by the
    reply's text, so the episode's token sequence can grow by the reply's
    sampled ids and these. None when the format does not (e.g. it strips a
    reply's whitespace): the rollout then renders that episode's prompts.
    """
    t = self.tokenizer
    head = t.chat_prompt(messages) + reply
    text = t.chat_prompt(after)
    if not text.startswith(head):
      return None
    return t.encode(text[len(head) :], add_bos=False)

  # -- sampling ---------------------------------------------------------------

  def sample(
      self,
      prompts: Sequence[Sequence[int]],
      *,
      role: str,
      max_new_tokens: int,
      temperature: float,
      seed: int,
      top_k: int = 0,
      top_p: float = 1.0,
      progress: str | None = None,
  ) -> list[tuple[list[int], list[float], str]]:
    """Samples a completion for every prompt (same result on every process).

    `temperature`, `top_k` (0: every token) and `top_p` (1.0: the whole
    mass) are the calling role's (`designer.*`, `designer.hint_*`,
    `agent.*`): the reference samples each role with its own settings.

    Through the slot engine, prompt i drawn with `fold_in(key(seed), i)`. A
    prompt must already fit `model.max_len - max_new_tokens` (the callers
    cut them with `prompt_budget`'s rule, `text.prompt_room`); one that does
    not is an error, never cut here, so the trainer later scores a
    completion in exactly its sampled context. `progress` names the call
    for its live line.
    """
    if not prompts:
      return []
    text.prompt_room(prompts, max_new_tokens, self.config.model.max_len)
    # A one-shot call (designs, hints) has no queue to refill slots from:
    # its slots are its prompts (a power of two, at most sampling.slots), so
    # a step does not decode empty slots.
    engine = self.slot_engine(
        role,
        temperature,
        min(shapes.bucket(len(prompts)), self.config.sampling.slots),
        top_k,
        top_p,
    )
    server = slot_server.TextServer(
        slot_server.SlotServer(
            engine, self.decode_params(), counts=self.prompt_counts
        ),
        self.tokenizer,
        max_new_tokens,
    )
    for i, p in enumerate(prompts):
      server.submit(i, [int(t) for t in p], seed, 0)
    if progress:
      console.first_compile(
          f"the {role} slot engine",
          (engine.slots, engine.cache_length),
          "slots x cache length, once per shape",
      )
    out = [None] * len(prompts)
    ticker = console.Ticker(
        progress or f"{role} sampling", total=len(prompts) * max_new_tokens
    )
    while server.busy:
      for key, ids, lps, txt in server.step():
        out[key] = (ids, lps, txt)
      ticker.update(
          server.tokens_generated,
          live=server.server.live + len(server.server.queue),
          rows=len(prompts),
      )
    ticker.close(server.tokens_generated, f", {len(prompts)} rows")
    return out

  def slot_engine(
      self,
      role: str,
      temperature: float,
      num_slots: int = 0,
      top_k: int = 0,
      top_p: float = 1.0,
      cache_length: int = 0,
  ) -> slot_engine.SlotEngine:
    """The slot engine of one role and sampling rule (compiled once per run
    and size): `num_slots` (default `config.sampling.slots`) decode slots of
    a `cache_length` cache (default `model.max_len`), each size rounded up
    to a multiple of the mesh's batch shards."""
    c = self.config
    shards = self.generator.batch_shards
    num_slots = shapes.round_up(num_slots or c.sampling.slots, shards)
    cache_length = min(cache_length or c.model.max_len, c.model.max_len)
    name = (role, float(temperature), num_slots, int(top_k), float(top_p))
    name += (cache_length,)
    if name not in self._slot_engines:
      fns = transformer.sampling_fns(
          self.generator.model_config, transformer.Role.of(role)
      )
      self._slot_engines[name] = slot_engine.SlotEngine(
          fns.tokens_to_logits,
          fns.init_cache,
          fns.prepare_params,
          pad_id=int(self.tokenizer.pad_id),
          stop_ids=tuple(int(i) for i in self.tokenizer.stop_ids),
          slots=num_slots,
          cache_length=cache_length,
          prefill_rows=shapes.round_up(
              min(c.sampling.prefill_rows, num_slots), shards
          ),
          **config_lib.slot_engine_options(c.sampling),
          temperature=float(temperature),
          top_k=int(top_k),
          top_p=float(top_p),
          mesh=self.mesh,
          rules=self.rules,
      )
    return self._slot_engines[name]

  def prefill_counts(self) -> tuple[int, int, int]:
    """Prompt tokens the slot servers of this run took in so far: (every
    prompt whole, those taken from a cache instead of prefilled, those
    carried from an episode's last turn), `slot_server.PromptCounts`."""
    n = self.prompt_counts
    return n.prompt, n.saved, n.carried

  def prompt_budget(self, role: str) -> int:
    """The prompt tokens a `role` reply may be sampled from (one rule)."""
    return prompt_budget(self.config, role)

  def agent_server(
      self,
      *,
      max_new_tokens: int,
      temperature: float,
      top_k: int = 0,
      top_p: float = 1.0,
  ) -> slot_server.TextServer:
    """The rollout's `TurnServer` for the agent head: a fresh slot
    server over the current params (`slot_engine`); an episode's turn
    continues its slot's cache while the slot still holds its history
    (`config.agent.carry_cache`).

    Its cache holds what one episode can reach, not `model.max_len`: a
    prompt of at most the agent's budget (`prompt_budget("agent")`) and a
    reply of `max_new_tokens`, rounded up to the prefill chunk (the slot
    engine's rule); 16 slots of the 1.5B's 3,072-step cache are 2.8 GB, of
    the 1,536 its `runlocal` reaches 1.4 GB."""
    c = self.config
    reach = self.prompt_budget("agent") + max_new_tokens
    engine = self.slot_engine(
        "agent", temperature, top_k=top_k, top_p=top_p,
        cache_length=shapes.round_up(
            reach, c.sampling.prefill_chunk or c.model.max_len
        ),
    )  # fmt: skip
    return slot_server.TextServer(
        slot_server.SlotServer(
            engine, self.decode_params(), counts=self.prompt_counts
        ),
        self.tokenizer,
        max_new_tokens,
        carry=self.config.agent.carry_cache,
    )

  # -- updates ----------------------------------------------------------------

  def _batch(self, rows: list[batching.Row]) -> dict[str, np.ndarray]:
    batch_axes = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
    return batching.make_batch(
        rows,
        max_len=self.config.model.max_len,
        pad_id=self.tokenizer.pad_id,
        row_multiple=batch_axes,
        min_rows=batch_axes,
    )

  def _global(self, batch):
    """Host batches (identical on every process) -> global device arrays."""
    sh = self.update_step.batch_sharding
    return jax.tree.map(
        lambda x: jax.make_array_from_callback(x.shape, sh, lambda i: x[i]),
        batch,
    )

  def update(
      self,
      agent_rows: list[batching.Row],
      designer_rows: list[batching.Row],
      samples: int = 0,
  ) -> dict[str, float]:
    """One shared update of both roles on the given rows; `samples` (the
    batch's samples, `score.update_rows`; 0: the rows given) divides the
    loss under `optim.loss_reduction="sample_mean"`, each row weighted by
    its `copies`."""
    batch = {
        "agent": self._batch(agent_rows),
        "designer": self._batch(designer_rows),
    }
    if self.config.optim.loss_reduction == "sample_mean":
      batch = update_lib.sample_weights(
          batch, samples or len(agent_rows) + len(designer_rows)
      )
    shape = tuple(b["tokens"].shape[0] for b in batch.values())
    first = console.first_compile(
        "the update",
        shape + (self.config.model.max_len,),
        "agent rows x designer rows x length, once per shape",
    )
    what = "compiling and running the update" if first else "update"
    with console.heartbeat(what):
      self.state, metrics = self.update_step(self.state, self._global(batch))
      metrics = jax.device_get(metrics)
    return {k: float(v) for k, v in metrics.items()}

  def warm_start(self, seeds: Sequence[Any], steps: int) -> None:
    """Supervised stage: designer learns prompt -> program, agent solutions."""
    from spade.designer import design_prompts  # pylint: disable=g-import-not-at-top

    c = self.config
    if c.train.warm_start_dir:
      return self._warm_start_rows(
          _folder_rows(self, c.train.warm_start_dir), [], steps
      )
    designer_rows, agent_rows = [], []
    for seed in seeds:
      prompt = self.render(design_prompts.designer_messages(None))
      designer_rows.append(
          batching.Row(prompt, self.tokenizer.encode(seed.source), [], 1.0)
      )
      history: list[tuple[str, str]] = []
      try:
        episode = library.solution_episode(seed.source, 0)
      except Exception as e:  # pylint: disable=broad-except
        logging.warning("seed %s has no replayable solution: %s", seed.name, e)
        continue
      # episode: (observation the action answered, action), in order.
      first = episode[0][0] if episode else ""
      for i, (_, action) in enumerate(episode):
        ids = agent_prompts.truncate_messages(
            agent_prompts.history_messages(
                first, None, history, style=c.agent.prompt_style
            ),
            self.render,
            self.prompt_budget("agent"),
        )
        agent_rows.append(
            batching.Row(ids, self.tokenizer.encode(action), [], 1.0)
        )
        after = episode[i + 1][0] if i + 1 < len(episode) else ""
        history.append((action, after))
    self._warm_start_rows(designer_rows, agent_rows, steps)

  def _warm_start_rows(self, designer_rows, agent_rows, steps: int) -> None:
    """`steps` supervised steps on batches drawn from the rows."""
    c = self.config
    # A supervised row is trained whole or not at all: a program or move cut
    # to fit would teach a broken one.
    fits = (
        lambda r: len(r.prompt_ids) + len(r.completion_ids) <= c.model.max_len
    )
    dropped = sum(not fits(r) for r in designer_rows + agent_rows)
    if dropped:
      logging.warning(
          "warm start: %d rows longer than model.max_len=%d left out",
          dropped,
          c.model.max_len,
      )
    designer_rows = [r for r in designer_rows if fits(r)]
    agent_rows = [r for r in agent_rows if fits(r)]
    if self._sft_step is None:
      self._sft_step = update_lib.make_sft_step(
          self.model, self.optimizer, self.mesh, c
      )
    rng = np.random.default_rng(c.seed)
    size = c.train.warm_start_batch
    ticker = console.Ticker(
        "warm start", total=steps, unit="steps", quiet_under=0
    )
    for step in range(steps):
      pick = (
          lambda rows: [rows[i] for i in rng.choice(len(rows), size)]
          if rows
          else []
      )
      batch = {
          "agent": self._batch(pick(agent_rows)),
          "designer": self._batch(pick(designer_rows)),
      }
      self.state, metrics = self._sft_step(self.state, self._global(batch))
      metrics = jax.device_get(metrics)
      logging.info("warm start %d/%d: %s", step + 1, steps, metrics)
      ticker.update(step + 1)
    ticker.close(steps)
    if self.state.ref_params is not None:
      # The KL term's reference is the policy self-play starts from (slime's
      # --ref-load, the checkpoint RL begins at), not the one before the
      # supervised stage.
      self.state = self.state.replace(
          ref_params=jax.tree.map(lambda x: x.copy(), self.state.params)
      )


def _folder_rows(engine: Engine, folder: str) -> list[batching.Row]:
  """Designer rows teaching the programs of `folder` (`train.
  warm_start_dir`), each from the prompt the design phase renders for
  iteration 0's first design (with grounding off and a prompt budget
  shorter than the instructions, every design's prompt is that one)."""
  import glob  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top

  from spade.designer import design_prompts  # pylint: disable=g-import-not-at-top
  from spade.selfplay import design as design_lib  # pylint: disable=g-import-not-at-top

  c = engine.config
  paths = sorted(glob.glob(os.path.join(os.path.expanduser(folder), "*.py")))
  if not paths:
    raise FileNotFoundError(
        f"config.train.warm_start_dir={folder!r} holds no *.py programs"
    )
  spec = design_prompts.pick_prompt(
      c.designer,
      iteration=0,
      index=0,
      seed=c.seed,
      regen_interval=c.designer.regeneration_interval,
  )
  prompt = design_lib.designer_prompt(c, engine, None, [], None, spec)
  rows = []
  for path in paths:
    with open(path) as f:
      source = f.read()
    completion = engine.tokenizer.encode(source) + [engine.tokenizer.eos_id]
    rows.append(batching.Row(prompt, completion, [], 1.0))
  return rows


def _place_releasing(params: dict[str, Any], shardings) -> None:
  """Places each leaf of `params` (dicts it owns: `layout.owned`) as the
  like tree `shardings` says, in place, one leaf at a time: a leaf that
  moves is held twice only until its new copy is ready, not the whole tree
  (the MLP's kernels are most of the weights)."""
  for k, v in params.items():
    if isinstance(v, dict):
      _place_releasing(v, shardings[k])
    elif not v.sharding.is_equivalent_to(shardings[k], v.ndim):
      params[k] = jax.device_put(v, shardings[k]).block_until_ready()
      del v
