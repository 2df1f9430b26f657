"""The archive of every environment the designer wrote.

An `Entry` keeps an environment's code, description (its class docstring),
the validator's verdict and reason, its stats over time (regret and win rates
with and without hint at each iteration it was played, times played) and its
lineage (parent, iteration), plus the grounding document it was written from.

What the loop calls:

  add(code, verdict=, iteration=, parent=, grounding_id=)
      -> (env_id, None) when archived, (None, duplicate_of) when rejected.
      Near-duplicates (`dedup.py`) are rejected before they enter. A valid
      program is compared with the valid entries only, so a fixed version of a
      broken program is never rejected as its copy; an invalid program is
      compared with all entries. Invalid programs are archived with their
      verdict (the designer learns from failures) but never replayed.
  update_stats(env_id, iteration=, regret=, win_rate_hint=, win_rate_nohint=,
      episodes=) after the env was played.
  prompt_examples(document, n): for the designer's prompt, in this order: the
      highest-regret entry, the nearest neighbour of the grounding document
      (an entry written from the same document, else the largest word overlap
      with its description), the most recent failure (with `reason`), then
      more of the highest-regret entries.
  replay(n, rng, iteration): ids of archived environments to play again,
      drawn by `replay.py` (PLR's rank score plus staleness).
  mutation_parent(rng): a high-regret entry for the designer to edit into a
      harder variant (rank-weighted among the top `mutation_pool`).
  state_dict() / Archive.from_state_dict(memory_config, d): the whole state as
      JSON, saved by the loop as WORKDIR/`MEMORY_FILE` and in the checkpoint.

Capacity policy (`config.memory.capacity`): when an add makes the archive
larger than capacity, one entry is evicted: invalid entries first (oldest
first), then the valid entry with the lowest latest regret (never played
counts as 0; ties: oldest). The `keep_recent` newest entries, the entry
being added and entries replayed in the current iteration are not evicted
(when every other entry is protected, the oldest goes). An evicted program's AST
fingerprint is kept, so an exact (renamed) copy of it is still rejected.

Disabled (`config.memory.enabled=False`, the paper's no-memory ablation):
entries are still recorded (for `show` and analysis) but nothing is rejected
as a duplicate, `prompt_examples` returns [], `replay` returns [] and
`mutation_parent` None.

Every method is deterministic given its arguments, so processes that make the
same calls hold identical archives.
"""

from __future__ import annotations

import ast
import base64
import dataclasses
import re
from typing import Any

import jax
import numpy as np

from spade.memory import dedup
from spade.memory import replay as replay_lib

MEMORY_FILE = "memory.json"
STATE_VERSION = 1

# Diversity is computed over at most this many of the newest valid entries:
# its cost is quadratic in the count.
_DIVERSITY_WINDOW = 256
_WORDS = re.compile(r"[a-z][a-z0-9]{2,}")
# Words too common in environment descriptions to indicate a topic.
_STOP = frozenset(
    "the and for with you your that this are from each which when will into "
    "its has have not can env environment game player agent turn turns must "
    "one two".split()
)


@dataclasses.dataclass
class Stats:
  """How an environment did each time it was played."""

  iterations: list[int] = dataclasses.field(default_factory=list)
  regret: list[float] = dataclasses.field(default_factory=list)
  win_rate_hint: list[float] = dataclasses.field(default_factory=list)
  win_rate_nohint: list[float] = dataclasses.field(default_factory=list)
  times_played: int = 0
  episodes: int = 0

  def get(self, name: str, default=None):
    """The latest value of a per-play series, or a counter, by name.

    `stats.get("regret")` is the latest regret (None if never played), so
    code written for dict-shaped stats reads the current value.

    Args:
      name: a field name.
      default: returned when the series is empty or the name unknown.
    """
    value = getattr(self, name, None)
    if isinstance(value, list):
      return value[-1] if value else default
    return default if value is None else value


@dataclasses.dataclass
class Lineage:
  """Where an environment came from."""

  parent: str | None
  iteration: int


@dataclasses.dataclass
class Entry:
  """One archived environment."""

  id: str
  code: str
  description: str
  verdict: dict
  reason: str
  stats: Stats
  lineage: Lineage
  grounding_id: str | None

  @property
  def valid(self) -> bool:
    """Whether the validator accepted the program (only these replay)."""
    return bool(self.verdict.get("valid", False))

  @property
  def iteration(self) -> int:
    """The iteration the environment was written in."""
    return self.lineage.iteration

  @property
  def latest_regret(self) -> float | None:
    """The regret measured the last time it was played; None if never."""
    return self.stats.regret[-1] if self.stats.regret else None

  def to_dict(self) -> dict:
    """JSON-able form."""
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict) -> "Entry":
    """Inverse of `to_dict`."""
    d = dict(d)
    d["stats"] = Stats(**d["stats"])
    d["lineage"] = Lineage(**d["lineage"])
    return cls(**d)


def describe(code: str) -> str:
  """The environment's description: its `*Env` class docstring.

  Falls back to the first class docstring, then the module docstring; only
  the first paragraph is kept. Code that does not parse has no description.

  Args:
    code: the program.

  Returns:
    One paragraph, or "".
  """
  try:
    tree = ast.parse(code)
  except (SyntaxError, ValueError):
    return ""
  classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
  ordered = [c for c in classes if c.name.endswith("Env")] + classes
  for node in ordered + [tree]:
    doc = ast.get_docstring(node)
    if doc:
      return " ".join(doc.strip().split("\n\n")[0].split())
  return ""


def _reason(verdict: dict) -> str:
  if verdict.get("valid"):
    return ""
  code = str(verdict.get("reason") or "")
  message = str(verdict.get("message") or "")
  return f"{code}: {message}" if code and message else code or message


def _words(text: str) -> set[str]:
  return {w for w in _WORDS.findall(text.lower()) if w not in _STOP}


def _on_host(state: replay_lib.ReplayState) -> replay_lib.ReplayState:
  """Commits the replay state to the CPU.

  Its tiny ops then stay off the accelerator: jitted functions run where their
  inputs live.
  """
  # This process's own CPU device: on several processes jax.devices("cpu")[0]
  # belongs to process 0 and the state would not be readable elsewhere.
  try:
    cpu = jax.local_devices(backend="cpu")[0]
  except RuntimeError:  # JAX_PLATFORMS without cpu: this process's device
    cpu = jax.local_devices()[0]
  return jax.device_put(state, cpu)


def _as_generator(rng) -> np.random.Generator:
  """An int seed or a JAX key, as a NumPy generator (host-side draws)."""
  if isinstance(rng, (int, np.integer)):
    return np.random.default_rng(int(rng))
  if isinstance(rng, jax.Array):
    data = jax.random.key_data(rng) if _is_typed_key(rng) else rng
    return np.random.default_rng(np.asarray(data).ravel().tolist())
  raise TypeError(
      f"rng must be an int seed or a JAX PRNG key, got {type(rng).__name__}"
  )


def _is_typed_key(x: jax.Array) -> bool:
  return jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _as_key(rng) -> jax.Array:
  """An int seed or a JAX key, as a JAX key."""
  if isinstance(rng, (int, np.integer)):
    return jax.random.key(int(rng))
  if isinstance(rng, jax.Array):
    return rng
  raise TypeError(
      f"rng must be an int seed or a JAX PRNG key, got {type(rng).__name__}"
  )


class Archive:
  """The environment memory; see the module docstring."""

  def __init__(self, memory_config):
    """An empty archive.

    Args:
      memory_config: `config.memory`.
    """
    c = memory_config
    if c.capacity < 1:
      raise ValueError(f"config.memory.capacity={c.capacity} must be >= 1")
    if not 0 <= c.keep_recent < c.capacity:
      raise ValueError(
          f"config.memory.keep_recent={c.keep_recent} must be in [0, "
          f"config.memory.capacity={c.capacity})"
      )
    if not 0.0 < c.duplicate_threshold <= 1.0:
      raise ValueError(
          f"config.memory.duplicate_threshold={c.duplicate_threshold} must "
          "be in (0, 1]"
      )
    if c.replay_temperature <= 0:
      raise ValueError("config.memory.replay_temperature must be > 0")
    if not 0.0 <= c.staleness_coef <= 1.0:
      raise ValueError("config.memory.staleness_coef must be in [0, 1]")
    if not 0.0 <= c.mutation_fraction <= 1.0:
      raise ValueError("config.memory.mutation_fraction must be in [0, 1]")
    self.config = c
    self.enabled = bool(c.enabled)
    self._entries: dict[str, Entry] = {}
    self._signatures: dict[str, np.ndarray] = {}
    self._fingerprints: dict[str, str | None] = {}
    # Slots: one more than capacity, since an add precedes its eviction.
    self._slots: dict[str, int] = {}
    self._free = list(range(c.capacity, -1, -1))
    self._replay = _on_host(replay_lib.init(c.capacity + 1))
    self._evicted_fingerprints: dict[str, list] = {}
    self._next_id = 0
    self._duplicates = 0
    self._evicted = 0
    self._replay_fraction = float(c.replay_fraction)
    self._replayed_now: tuple[int, list[str]] = (-1, [])

  # Reading.

  def __len__(self) -> int:
    return len(self._entries)

  def __contains__(self, env_id: str) -> bool:
    return env_id in self._entries

  def __getitem__(self, env_id: str) -> Entry:
    try:
      return self._entries[env_id]
    except KeyError:
      raise KeyError(
          f"environment {env_id!r} is not in the archive (never added, "
          "rejected as a duplicate, or evicted)"
      ) from None

  def get(self, env_id: str, default: Entry | None = None) -> Entry | None:
    """The entry with this id, or `default` when it is not archived."""
    return self._entries.get(env_id, default)

  def entries(self) -> list[Entry]:
    """All entries, oldest first."""
    return list(self._entries.values())

  # Adding.

  def _find_duplicate(
      self, valid: bool, fingerprint: str | None, signature: np.ndarray
  ) -> str | None:
    pool = [
        i for i, e in self._entries.items() if e.valid or not valid
    ]  # a valid program is only compared with valid ones
    if fingerprint is not None:
      for i in pool:
        if self._fingerprints[i] == fingerprint:
          return i
      old = self._evicted_fingerprints.get(fingerprint)
      if old is not None and (old[1] or not valid):
        return old[0]
    if not pool:
      return None
    sims = dedup.similarity(
        signature, np.stack([self._signatures[i] for i in pool])
    )
    best = int(np.argmax(sims))
    if sims[best] >= self.config.duplicate_threshold:
      return pool[best]
    return None

  def add(
      self,
      code: str,
      *,
      verdict: dict,
      iteration: int,
      parent: str | None = None,
      grounding_id: str | None = None,
  ) -> tuple[str | None, str | None]:
    """Archives a program unless it nearly duplicates an archived one.

    Args:
      code: the program's source.
      verdict: the validator's verdict; must have "valid" (bool), and for an
        invalid program "reason" (short code) and/or "message".
      iteration: the iteration it was written in.
      parent: the entry it was mutated from, if any.
      grounding_id: the id of the document it was grounded on, if any.

    Returns:
      (env_id, None) when archived; (None, id of the entry it duplicates)
      when rejected.
    """
    if "valid" not in verdict:
      raise ValueError(
          "Archive.add: verdict needs a 'valid' key (the validator's verdict "
          f"dict); got keys {sorted(verdict)}"
      )
    valid = bool(verdict["valid"])
    fingerprint = dedup.ast_fingerprint(code)
    signature = dedup.minhash(code)
    if self.enabled:
      duplicate = self._find_duplicate(valid, fingerprint, signature)
      if duplicate is not None:
        self._duplicates += 1
        return None, duplicate
    env_id = f"env-{self._next_id:06d}"
    self._next_id += 1
    self._entries[env_id] = Entry(
        id=env_id,
        code=code,
        description=describe(code),
        verdict=dict(verdict),
        reason=_reason(verdict),
        stats=Stats(),
        lineage=Lineage(parent=parent, iteration=int(iteration)),
        grounding_id=grounding_id,
    )
    self._signatures[env_id] = signature
    self._fingerprints[env_id] = fingerprint
    if valid:
      slot = self._free.pop()
      self._slots[env_id] = slot
      self._replay = replay_lib.insert(self._replay, slot, 0.0, int(iteration))
    while len(self._entries) > self.config.capacity:
      self._evict_one(keep=env_id, iteration=int(iteration))
    return env_id, None

  def _evict_one(self, keep: str | None = None, iteration: int = -1) -> None:
    ids = list(self._entries)
    protected = set(ids[len(ids) - self.config.keep_recent :])
    if self._replayed_now[0] >= iteration:  # replayed in this iteration
      protected |= set(self._replayed_now[1])
    protected.add(keep)
    candidates = [i for i in ids if i not in protected]
    candidates = candidates or [i for i in ids if i != keep][:1]
    invalid = [i for i in candidates if not self._entries[i].valid]
    if invalid:
      victim = invalid[0]
    else:
      victim = min(
          candidates,
          key=lambda i: (self._entries[i].latest_regret or 0.0, i),
      )
    self._drop(victim)

  def _drop(self, env_id: str) -> None:
    entry = self._entries.pop(env_id)
    fingerprint = self._fingerprints.pop(env_id)
    self._signatures.pop(env_id)
    if fingerprint is not None:
      self._evicted_fingerprints[fingerprint] = [env_id, entry.valid]
    slot = self._slots.pop(env_id, None)
    if slot is not None:
      self._replay = replay_lib.remove(self._replay, slot)
      self._free.append(slot)
    self._evicted += 1

  # Stats.

  def update_stats(
      self,
      env_id: str,
      *,
      iteration: int,
      regret: float,
      win_rate_hint: float,
      win_rate_nohint: float,
      episodes: int,
  ) -> None:
    """Records one play of an environment.

    Args:
      env_id: the entry.
      iteration: the iteration it was played in.
      regret: its regret this time (its new replay score).
      win_rate_hint: fraction of hinted episodes won.
      win_rate_nohint: fraction of unhinted episodes won.
      episodes: episodes played (hinted and not).
    """
    entry = self[env_id]
    s = entry.stats
    s.iterations.append(int(iteration))
    s.regret.append(float(regret))
    s.win_rate_hint.append(float(win_rate_hint))
    s.win_rate_nohint.append(float(win_rate_nohint))
    s.times_played += 1
    s.episodes += int(episodes)
    slot = self._slots.get(env_id)
    if slot is not None:
      self._replay = replay_lib.update(
          self._replay, slot, float(regret), int(iteration)
      )

  # Retrieval.

  def _by_regret(self) -> list[Entry]:
    """Valid entries: played ones by latest regret (desc), then unplayed."""
    valid = [e for e in self._entries.values() if e.valid]
    played = [e for e in valid if e.stats.times_played]
    unplayed = [e for e in valid if not e.stats.times_played]
    # Stable sorts: ties keep the newer entry first.
    played = sorted(reversed(played), key=lambda e: -e.latest_regret)
    return played + unplayed[::-1]

  def _neighbour(self, document) -> Entry | None:
    valid = [e for e in self._entries.values() if e.valid]
    same = [e for e in valid if e.grounding_id == document.id]
    if same:
      return same[-1]
    doc_words = _words(document.title + " " + document.text)
    best, best_score = None, 0.0
    for e in reversed(valid):
      words = _words(e.description)
      if not words:
        continue
      score = len(words & doc_words) / len(words)
      if score > best_score:
        best, best_score = e, score
    return best

  def prompt_examples(self, document=None, n: int = 2) -> list[Entry]:
    """Entries to show the designer; see the module docstring for the order.

    Args:
      document: the grounding `Document` of the prompt, or None.
      n: at most this many entries.

    Returns:
      Up to `n` distinct entries ([] when memory is disabled). Failures have
      `valid` False and say why in `reason`.
    """
    if not self.enabled or n <= 0 or not self._entries:
      return []
    top = self._by_regret()
    failures = [e for e in reversed(self._entries.values()) if not e.valid]
    picks = [
        top[0] if top else None,
        self._neighbour(document) if document is not None else None,
        failures[0] if failures else None,
    ] + top[1:]
    out, seen = [], set()
    for e in picks:
      if e is not None and e.id not in seen:
        out.append(e)
        seen.add(e.id)
      if len(out) == n:
        break
    return out

  # Replay and mutation.

  def replay_probabilities(self, iteration: int) -> dict[str, float]:
    """The current replay distribution, by environment id."""
    p = np.asarray(
        replay_lib.probabilities(
            self._replay,
            iteration,
            self.config.replay_temperature,
            self.config.staleness_coef,
        )
    )
    return {i: float(p[s]) for i, s in self._slots.items()}

  def replay(self, n: int, rng_seed_or_key, iteration: int) -> list[str]:
    """Draws up to `n` distinct archived environments to play again.

    Args:
      n: how many; fewer come back when fewer valid entries exist.
      rng_seed_or_key: an int seed or a JAX PRNG key (the same on every
        process, so they draw the same ids).
      iteration: the current iteration; drawn entries' staleness resets.

    Returns:
      Environment ids ([] when memory is disabled).
    """
    if not self.enabled or n <= 0:
      return []
    k = min(n, len(self._slots))
    if k == 0:
      return []
    self._replay, slots = replay_lib.sample(
        self._replay,
        _as_key(rng_seed_or_key),
        k,
        int(iteration),
        float(self.config.replay_temperature),
        float(self.config.staleness_coef),
    )
    by_slot = {s: i for i, s in self._slots.items()}
    ids = [by_slot[int(s)] for s in np.asarray(slots)]
    previous = self._replayed_now
    kept = previous[1] if previous[0] == iteration else []
    self._replayed_now = (int(iteration), kept + ids)
    return ids

  def mutation_parent(self, rng) -> Entry | None:
    """A high-regret entry for the designer to edit into a harder variant.

    Drawn among the `mutation_pool` highest-regret played entries with the
    replay's rank weights, (1/rank)**(1/temperature).

    Args:
      rng: an int seed or a JAX PRNG key.

    Returns:
      The parent, or None (memory disabled, or nothing played yet).
    """
    if not self.enabled:
      return None
    pool = [e for e in self._by_regret() if e.stats.times_played]
    pool = pool[: self.config.mutation_pool]
    if not pool:
      return None
    w = (1.0 / np.arange(1, len(pool) + 1)) ** (
        1.0 / self.config.replay_temperature
    )
    return pool[int(_as_generator(rng).choice(len(pool), p=w / w.sum()))]

  # Metrics.

  def set_replay_fraction(self, fraction: float) -> None:
    """Records the fraction of this iteration's envs that were replays."""
    if not 0.0 <= fraction <= 1.0:
      raise ValueError(f"replay fraction {fraction} must be in [0, 1]")
    self._replay_fraction = float(fraction)

  def diversity(self) -> float:
    """1 - mean pairwise similarity of the newest valid programs."""
    ids = [i for i, e in self._entries.items() if e.valid]
    ids = ids[-_DIVERSITY_WINDOW:]
    if len(ids) < 2:
      return 0.0
    return dedup.diversity(np.stack([self._signatures[i] for i in ids]))

  def metrics(self) -> dict[str, float]:
    """Scalars for metrics.jsonl."""
    return {
        "memory/size": float(len(self._entries)),
        "memory/valid": float(len(self._slots)),
        "memory/duplicates_rejected": float(self._duplicates),
        "memory/evicted": float(self._evicted),
        "memory/replay_fraction": self._replay_fraction,
        "memory/diversity": self.diversity(),
    }

  # State.

  def state_dict(self) -> dict[str, Any]:
    """The whole archive as JSON-able data (identical on every process)."""
    scores = np.asarray(self._replay.scores)
    last = np.asarray(self._replay.last_sampled)
    replay_slots = {
        i: {"score": float(scores[s]), "last_sampled": int(last[s])}
        for i, s in self._slots.items()
    }
    return {
        "version": STATE_VERSION,
        "entries": [e.to_dict() for e in self._entries.values()],
        "replay": replay_slots,
        "next_id": self._next_id,
        "duplicates_rejected": self._duplicates,
        "evicted": self._evicted,
        "evicted_fingerprints": dict(self._evicted_fingerprints),
        # Saved so a restore need not re-tokenise every program (~10 ms
        # each); base64 of the little-endian uint64 MinHash values.
        "signature_scheme": dedup.SCHEME,
        "signatures": {
            i: [
                self._fingerprints[i],
                base64.b64encode(
                    self._signatures[i].astype("<u8").tobytes()
                ).decode(),
            ]
            for i in self._entries
        },
        "replay_fraction": self._replay_fraction,
        "replayed_now": [self._replayed_now[0], list(self._replayed_now[1])],
    }

  @classmethod
  def from_state_dict(cls, memory_config, d: dict) -> "Archive":
    """Rebuilds an archive from `state_dict()`, under `memory_config`.

    Entries keep their order; replay slots are reassigned (a changed capacity
    is fine: extra entries are evicted by the usual policy). Signatures come
    from the state, or are recomputed from the code where it has none or
    saved them under another `dedup.SCHEME`.

    Args:
      memory_config: `config.memory`.
      d: a dict from `state_dict()` (for example read from MEMORY_FILE).

    Returns:
      The archive.
    """
    if d.get("version") != STATE_VERSION:
      raise ValueError(
          f"memory state version {d.get('version')!r} is not {STATE_VERSION}:"
          " it was written by another SPADE version"
      )
    a = cls(memory_config)
    a._next_id = int(d["next_id"])
    a._duplicates = int(d["duplicates_rejected"])
    a._evicted = int(d["evicted"])
    a._evicted_fingerprints = {
        k: list(v) for k, v in d["evicted_fingerprints"].items()
    }
    a._replay_fraction = float(d["replay_fraction"])
    a._replayed_now = (int(d["replayed_now"][0]), list(d["replayed_now"][1]))
    # Signatures of another scheme (an older SPADE's) are recomputed.
    signatures = {}
    if d.get("signature_scheme") == dedup.SCHEME:
      signatures = d.get("signatures", {})
    for raw in d["entries"]:
      e = Entry.from_dict(raw)
      a._entries[e.id] = e
      saved = signatures.get(e.id)
      if saved is not None:
        a._fingerprints[e.id] = saved[0]
        a._signatures[e.id] = np.frombuffer(
            base64.b64decode(saved[1]), dtype="<u8"
        ).astype(np.uint64)
      else:
        a._signatures[e.id] = dedup.minhash(e.code)
        a._fingerprints[e.id] = dedup.ast_fingerprint(e.code)
      if e.valid:
        slot = a._free.pop() if a._free else None
        if slot is None:  # more valid entries than the new capacity allows
          a._free.append(len(a._slots))
          a._grow(len(a._slots) + 1)
          slot = a._free.pop()
        a._slots[e.id] = slot
        r = d["replay"][e.id]
        a._replay = replay_lib.insert(
            a._replay, slot, r["score"], r["last_sampled"]
        )
    while len(a._entries) > a.config.capacity:
      a._evict_one()
    return a

  def _grow(self, size: int) -> None:
    """Enlarges the replay buffer (restoring under a smaller capacity)."""
    old = self._replay
    pad = size - old.scores.shape[0]
    if pad <= 0:
      return
    new = _on_host(replay_lib.init(size))
    self._replay = replay_lib.ReplayState(
        scores=new.scores.at[: old.scores.shape[0]].set(old.scores),
        last_sampled=new.last_sampled.at[: old.scores.shape[0]].set(
            old.last_sampled
        ),
        valid=new.valid.at[: old.scores.shape[0]].set(old.valid),
    )
