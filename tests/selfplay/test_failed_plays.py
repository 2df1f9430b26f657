"""Failed plays: retried once, then dropped; hung programs left out for the run.

The reference's `play_games_async` plays a failed play again once (a hang
never), and its `_hung_game_blacklist` keeps a game that hung from being
played again (core/orchestrator.py). A fake policy and a fake sandbox (no
model, no gVisor) drive the real `play_phase.play` and `Trainer.iteration`.
"""

import json
import types

from spade import config as config_lib
from spade.agent import rollout
from spade.selfplay import loop
from spade.selfplay import play_phase
from spade.selfplay import records
from spade.selfplay import state as state_lib


class Programs:
  """The sandbox's stand-in. A program is named by its source:

  "ok": won in one step; "flaky": the first reset of each (seed, arm)
  loses its sandbox, later ones work; "broken": every reset crashes;
  "hangs": resets, then its step() runs past its budget; "slow_tool": a
  tool-use task whose tool runs past its budget.
  """

  def __init__(self):
    self.resets: list[tuple[str, int, bool]] = []
    self.live: dict[int, str] = {}

  def episodes(self):
    return self

  def reset(self, items):
    out = []
    for eid, source, seed, want_hint in items:
      first = (source, seed, want_hint) not in self.resets
      self.resets.append((source, seed, want_hint))
      if source == "broken" or (source == "flaky" and first):
        reason = "crash" if source == "broken" else "sandbox_lost"
        out.append({"ok": False, "reason": reason, "message": "gone"})
        continue
      self.live[eid] = source
      tools = source == "slow_tool"
      out.append(
          {"ok": True, "obs": "use tools" if tools else "play", "tools": tools}
      )
    return out

  def step(self, items):
    out = []
    for eid, _ in items:
      if self.live[eid] == "hangs":
        out.append(
            {"ok": False, "reason": "call_timeout", "message": "ran 31 s"}
        )
      else:
        out.append(
            {
                "ok": True,
                "obs": "won",
                "reward": 1.0,
                "terminated": True,
                "truncated": False,
                "info": {},
            }
        )
    return out

  def call(self, items):
    return [
        {"ok": False, "reason": "call_timeout", "message": "ran 31 s"}
        for _ in items
    ]

  def close(self, ids):
    for eid in ids:
      self.live.pop(eid, None)

  def played(self, hinted=False):
    """The sources reset so far in the arm, in order."""
    return [s for s, _, h in self.resets if h == hinted]


class Policy:
  """What `play_phase.play` and the loop ask of the engine."""

  def __init__(self):
    self.tokenizer = types.SimpleNamespace(stop_ids=())
    self.updates = []

  def render(self, messages):
    return [ord(c) % 256 for c in "".join(m["content"] for m in messages)]

  def prompt_budget(self, role):
    del role
    return 10_000

  def prefill_counts(self):
    return 0, 0, 0

  def agent_server(self, **kwargs):
    del kwargs

    def sample(prompts, seed, keys=None):
      del seed, keys
      out = []
      for ids in prompts:
        reply = "\\boxed{win}"
        if "use tools" in "".join(map(chr, ids)):
          reply = '<tool_call>{"name": "look", "arguments": {}}</tool_call>'
        out.append(([1, 2], [-0.5, -0.5], reply))
      return out

    return rollout.BatchedTurns(sample)

  def update(self, agent_rows, designer_rows, samples=0):
    del samples
    self.updates.append((list(agent_rows), list(designer_rows)))
    return {}


def _config(**overrides):
  c = config_lib.base_config()
  c.grounding.enabled = False
  c.agent.episode_rows = False
  c.agent.episodes_per_env = 2
  c.train.save_programs = False
  for key, value in overrides.items():
    section, name = key.split(".")
    c[section][name] = value
  return c


def _envs(*sources):
  return [records.Environment(s, "seed", None, name=s) for s in sources]


def _play(c, programs, sources, hinted_arm=False, skip=()):
  return play_phase.play(
      c, Policy(), programs, 0, _envs(*sources), hinted_arm, skip=skip
  )


def test_a_play_failing_once_is_played_again_with_its_seed_and_kept():
  programs = Programs()
  episodes, stats = _play(_config(), programs, ["ok", "flaky"])
  assert not any(ep.env_failed for ep in episodes)
  assert (stats.retried_plays, stats.dropped_plays) == (2, 0)
  flaky = [(s, seed) for s, seed, _ in programs.resets if s == "flaky"]
  # Each of its two plays reset twice, with the same seed both times.
  assert len(flaky) == 4 and len(set(flaky)) == 2
  by_sample = {ep.sample: ep for ep in episodes if ep.env_index == 1}
  assert sorted(by_sample) == [0, 1]
  assert all(ep.won for ep in by_sample.values())


def test_a_play_failing_twice_is_dropped():
  programs = Programs()
  episodes, stats = _play(_config(), programs, ["ok", "broken"])
  broken = [ep for ep in episodes if ep.env_index == 1]
  assert len(broken) == 2
  assert all(ep.env_failed and ep.failure == "crash" for ep in broken)
  assert (stats.retried_plays, stats.dropped_plays) == (2, 2)
  assert programs.played().count("broken") == 4


def test_with_no_retries_a_failed_play_is_dropped_at_once():
  programs = Programs()
  c = _config(**{"agent.retry_failed_plays": 0})
  episodes, stats = _play(c, programs, ["flaky"])
  assert all(ep.env_failed for ep in episodes)
  assert (stats.retried_plays, stats.dropped_plays) == (0, 2)
  assert programs.played().count("flaky") == 2


def test_a_hung_play_and_a_hinted_play_are_not_played_again():
  programs = Programs()
  episodes, stats = _play(_config(), programs, ["hangs", "flaky"], True)
  hung = [ep for ep in episodes if ep.env_index == 0]
  assert all(rollout.hung(ep) for ep in hung) and len(hung) == 4
  assert programs.played().count("hangs") == 2
  # The reference plays its hinted plays once (`_play_game_with_hint_async`).
  assert programs.played(hinted=True).count("flaky") == 2
  flaky_hinted = [ep for ep in episodes if ep.env_index == 1 and ep.hinted]
  assert all(ep.env_failed for ep in flaky_hinted)
  # Two unhinted flaky plays retried; the hangs' two unhinted plays dropped.
  assert (stats.retried_plays, stats.dropped_plays) == (2, 2)


def test_a_tool_call_past_its_budget_is_retried_and_not_a_hang():
  # The reference's execute_tool timeout fails the play without
  # blacklisting its game, so its retry is played.
  programs = Programs()
  episodes, stats = _play(_config(), programs, ["slow_tool"])
  assert all(ep.failure == rollout.TOOL_TIMEOUT for ep in episodes)
  assert not any(rollout.hung(ep) for ep in episodes)
  assert (stats.retried_plays, stats.dropped_plays) == (2, 2)
  assert programs.played().count("slow_tool") == 4


def test_skipped_environments_are_not_played():
  programs = Programs()
  episodes, _ = _play(_config(), programs, ["hangs", "ok"], True, skip={0})
  assert {ep.env_index for ep in episodes} == {1}
  assert "hangs" not in programs.played() + programs.played(hinted=True)


class _Run:
  """A run on the fakes: `loop.iteration` with its state carried along;
  the fixed pool is `seeds`, programs named by their source."""

  def __init__(self, c, seeds=()):
    self.config = c
    self.engine = Policy()
    self.envs = Programs()
    pool = play_phase.pool_programs(
        c, self.envs, [types.SimpleNamespace(name=s, source=s) for s in seeds]
    )
    self.state = state_lib.LoopState.create(c).replace(pool=tuple(pool))

  def iteration(self, it):
    self.state, m = loop.iteration(
        self.config, self.engine, self.envs, self.state, it
    )
    return m


def _trainer(c, tmp_path, seeds=()):
  del tmp_path  # the fakes write nothing
  return _Run(c, seeds)


def _pool_config(blacklist):
  return _config(
      **{
          "train.mode": "fixed_pool",
          "train.pool_draw": "without_replacement",
          "designer.num_envs": 2,
          "environments.blacklist_hung": blacklist,
      }
  )


def test_a_program_that_hung_is_not_played_in_later_iterations(tmp_path):
  t = _trainer(_pool_config(True), tmp_path, seeds=("hangs", "ok"))
  before = t.state
  m0 = t.iteration(0)
  pool = t.state.pool
  assert sorted(set(t.envs.played())) == ["hangs", "ok"]
  assert m0["rollout/hung_blacklist_size"] == 1.0
  assert not before.hung  # the iteration returned the grown blacklist
  assert m0["agent/dropped_plays"] == 2.0  # the hung plays
  assert m0["agent/retried_plays"] == 0.0
  # The blacklist is loop state: a checkpoint round trip keeps it.
  saved = json.loads(json.dumps(t.state.to_json()))
  t.state = state_lib.LoopState.create(t.config).restored(saved)
  t.state = t.state.replace(pool=pool)
  assert t.state.is_hung("hangs") and not t.state.is_hung("ok")
  t.envs.resets.clear()
  m1 = t.iteration(1)
  assert set(t.envs.played()) == {"ok"}
  assert m1["agent/num_envs"] == 1.0
  assert m1["rollout/hung_blacklist_size"] == 1.0


def test_with_the_blacklist_off_a_program_that_hung_is_played_again(
    tmp_path,
):
  t = _trainer(_pool_config(False), tmp_path, seeds=("hangs", "ok"))
  m0 = t.iteration(0)
  assert m0["rollout/hung_blacklist_size"] == 0.0
  t.envs.resets.clear()
  t.iteration(1)
  assert sorted(set(t.envs.played())) == ["hangs", "ok"]


def test_a_window_skips_its_program_that_hung_in_its_later_iterations(
    tmp_path,
):
  c = _config(**{"designer.regeneration_interval": 4})
  c.num_iterations = 10
  t = _trainer(c, tmp_path)
  envs = _envs("hangs", "ok")
  t.state = t.state.replace(window=records.Window.open(0, envs, []))
  t.iteration(1)
  assert sorted(set(t.envs.played())) == ["hangs", "ok"]
  assert t.state.window is not None and t.state.is_hung("hangs")
  t.envs.resets.clear()
  t.iteration(2)
  assert set(t.envs.played()) == {"ok"}
  # The window keeps both environments; the skipped one gains no plays.
  window = t.state.window
  assert [e.source for e in window.envs] == ["hangs", "ok"]
  unhinted = window.mask[..., 0].sum(axis=2)  # plays per env and step
  assert unhinted[0, 1] == 0 and unhinted[1, 1] == 2
