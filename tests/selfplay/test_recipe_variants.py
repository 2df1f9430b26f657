"""The recipe's variants (configs/reference_recipe.py): RLVE, the static pool
and tool use, each run through spade.main on its CPU twin; their state
across a resume."""

import importlib.util
import json
import os
import random
import subprocess
import sys

import pytest

from spade import config as config_lib
from spade.environments import rlve
from spade.selfplay import state as state_lib
from spade.selfplay import metrics as metrics_lib

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
RECIPE = os.path.join(ROOT, "configs", "reference_recipe.py")
# The RLVE twin's windows promote after 2 plays at the top whatever the
# accuracy, so a resumed run must restore them to draw the same levels.
PROMOTE = ("--config.difficulty.tau_num=2", "--config.difficulty.tau_acc=0.0")


def _recipe(arg):
  spec = importlib.util.spec_from_file_location("reference_recipe", RECIPE)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def _run(variant, workdir, iterations, extra=()):
  """One spade.main run; returns its output (asserting it succeeded)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env["XLA_FLAGS"] = os.environ.get("SPADE_TEST_XLA_FLAGS", "")
  proc = subprocess.run(
      [
          sys.executable,
          "-m",
          "spade.main",
          f"--config={RECIPE}:{variant}",
          f"--config.num_iterations={iterations}",
          f"--workdir={workdir}",
          *extra,
      ],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=900,
      check=False,
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  return proc.stderr


def _loop_state(workdir, step):
  """The checkpoint's loop state (orbax's JSON item) at `step`."""
  path = os.path.join(workdir, "checkpoints", str(step), "curriculum")
  with open(os.path.join(path, "metadata")) as f:
    return json.load(f)


def _played(workdir, it):
  with open(
      os.path.join(workdir, "programs", f"iter_{it:06d}", "verdicts.json")
  ) as f:
    return [p["name"] for p in json.load(f)["played"]]


def test_the_variants_carry_the_reference_values():
  r = _recipe("rlve")
  config_lib.validate(r)
  assert (r.train.mode, r.train.family) == ("adaptive", "rlve")
  assert (r.designer.num_envs, r.agent.episodes_per_env) == (16, 16)
  assert r.agent.temperature == 1.0 and r.agent.action == "raw"
  assert r.regret.agent_advantage == "normalize"
  d = r.difficulty
  assert (d.tau_acc, d.tau_num, d.d_delta, d.max_level) == (0.9, 128, 4, 20)
  s = _recipe("static_pool")
  assert (s.train.mode, s.train.pool_draw) == (
      "fixed_pool",
      "without_replacement",
  )
  assert (s.designer.num_envs, s.agent.plays_per_iteration) == (24, 192)
  assert s.agent.temperature == 0.6 and not s.agent.play_hinted
  t = _recipe("tool_use")
  assert t.designer.prompt_family == "tool_use_multi_turn"
  assert len(t.designer.tool_use_skills) == 6
  assert t.designer.regeneration_interval == 8
  assert t.grounding.max_words == 4000
  assert t.designer.hint_max_new_tokens == 2048
  assert t.optim.kl_coef == 0.005
  # SPADE_RESET_GATE=1 in the tool-use recipe only.
  assert t.environments.reset_gate
  assert not (r.environments.reset_gate or s.environments.reset_gate)
  assert not _recipe(None).environments.reset_gate
  for variant in ("rlve", "static_pool", "tool_use"):
    tiny = _recipe(variant + "_runlocal")
    config_lib.validate(tiny)
    assert tiny.tokenizer.kind == "bytes" and tiny.num_iterations == 1
  with pytest.raises(ValueError, match="no variant"):
    _recipe("rlve_big")


def test_draw_pool_is_the_references_draw_without_replacement():
  """`LoopState.draw_pool` against spade_rollout's algorithm, with a
  refill, and through a save and load of the loop state."""

  def reference(names, n, batches, seed):
    rng = random.Random(seed)
    canonical = sorted(names)
    remaining = list(canonical)
    rng.shuffle(remaining)
    out = []
    for _ in range(batches):
      selected, remaining = remaining[:n], remaining[n:]
      if len(selected) < n:
        refill = list(canonical)
        rng.shuffle(refill)
        refill = [p for p in refill if p not in selected]
        needed = n - len(selected)
        selected.extend(refill[:needed])
        remaining = refill[needed:]
      out.append(selected)
    return out

  c = config_lib.base_config()
  c.train.mode = "fixed_pool"
  names = [f"game_{i:03d}.py" for i in range(7)]
  state = state_lib.LoopState.create(c)
  drawn = []

  def draw(state):
    names_, cursor = state.draw_pool(names, 3)
    drawn.append(names_)
    return state.replace(pool_cursor=cursor)

  for _ in range(2):
    state = draw(state)
  resumed = state_lib.LoopState.create(c).restored(
      json.loads(json.dumps(state.to_json()))
  )
  for _ in range(3):
    resumed = draw(resumed)
  assert drawn == reference(names, 3, 5, c.seed)
  # Nothing repeats before the pool is used up: 7 names, then the refill.
  assert len(set(drawn[0] + drawn[1])) == 6
  assert set(drawn[0] + drawn[1] + drawn[2][:1]) == set(names)
  # A pool smaller than a batch gives all of it, once.
  small, _ = state_lib.LoopState.create(c).draw_pool(names[:2], 3)
  assert sorted(small) == names[:2]


@pytest.mark.sandbox
@pytest.mark.slow
def test_rlve_logs_every_level_and_its_windows_survive_a_resume(tmp_path):
  """One iteration of rlve_runlocal logs every environment's level; a run
  resumed from it to two keeps the windows and plays what an uninterrupted
  run plays. (One test: as two sharing the first run, a module fixture,
  each xdist worker that drew one of them made that run again.)"""
  if importlib.util.find_spec("Gym") is None:
    pytest.skip("rlve-gym is not installed (pip install -e '.[eval]')")
  rlve_run = str(tmp_path / "resumed")
  _run("rlve_runlocal", rlve_run, 1, PROMOTE)
  (row,) = metrics_lib.read_metrics(rlve_run)
  for name in rlve.OFFICIAL:
    # Two plays at level 0, then the promotion the test's tau allows.
    assert row[f"difficulty/{name}"] == 1.0, name
  assert row["difficulty/num_envs"] == 16.0
  assert row["agent/num_envs"] == 16.0 and row["agent/episodes"] == 32.0
  assert sorted(_played(rlve_run, 0)) == sorted(
      f"rlve:{n}@d0" for n in rlve.OFFICIAL
  )
  out = _run("rlve_runlocal", rlve_run, 2, PROMOTE)
  assert "resumed from" in out
  reference = str(tmp_path / "uninterrupted")
  _run("rlve_runlocal", reference, 2, PROMOTE)
  resumed, uninterrupted = _loop_state(rlve_run, 2), _loop_state(reference, 2)
  assert resumed["difficulty"] == uninterrupted["difficulty"]
  assert _played(rlve_run, 1) == _played(reference, 1)
  highs = {w["high"] for w in resumed["difficulty"].values()}
  assert highs <= {1, 2} and 2 in highs  # promoted from the level drawn


@pytest.mark.sandbox
@pytest.mark.slow
def test_static_pool_draws_without_replacement_across_a_resume(tmp_path):
  resumed = str(tmp_path / "resumed")
  _run("static_pool_runlocal", resumed, 1)
  out = _run("static_pool_runlocal", resumed, 3)
  assert "resumed from" in out
  reference = str(tmp_path / "uninterrupted")
  _run("static_pool_runlocal", reference, 3)
  drawn = [_played(resumed, it) for it in range(3)]
  assert drawn == [_played(reference, it) for it in range(3)]
  names = [n for batch in drawn for n in batch]
  assert len(names) == 6 and len(set(names)) == 6  # no program twice
  assert (
      _loop_state(resumed, 3)["pool_cursor"]
      == _loop_state(reference, 3)["pool_cursor"]
  )
  row, *_ = metrics_lib.read_metrics(resumed)
  assert row["agent/episodes"] == 4.0  # 2 games x 2 plays, no hinted arm


@pytest.mark.sandbox
@pytest.mark.slow
def test_tool_use_runlocal_runs_an_iteration(tmp_path):
  workdir = str(tmp_path / "tool_use")
  _run("tool_use_runlocal", workdir, 1)
  (row,) = metrics_lib.read_metrics(workdir)
  assert row["designer/num_designs"] >= 1.0
  with open(os.path.join(workdir, "config.json")) as f:
    config = json.load(f)
  assert config["designer"]["prompt_family"] == "tool_use_multi_turn"
  assert config["designer"]["regeneration_interval"] == 2
  # The recipe's compact filter reports what it kept out of the update.
  assert 0.0 <= row["rollout/compact_filtered_pct"] <= 1.0
  assert row["rollout/compact_filtered_count"] <= row["agent/episodes"]
  assert "agent/malformed_tool_calls" in row
