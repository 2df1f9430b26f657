"""Whole-state checkpoints: round trip, resume point, corrupt-latest fallback."""

import glob
import os

import jax
import jax.numpy as jnp
import numpy as np

from spade.train import checkpoints


def _state(value):
  return {
      "params": {"w": jnp.full((4, 3), value, jnp.float32)},
      "step": jnp.asarray(int(value), jnp.int32),
      "rng": jax.random.PRNGKey(int(value)),
  }


def test_round_trip_and_fallback(tmp_path):
  manager = checkpoints.make_manager(str(tmp_path), keep=3)
  for step in (1, 2):
    checkpoints.save(
        manager, step, _state(step), {"cursor": step, "memory": []}
    )
  step, state, curriculum = checkpoints.restore_latest(
      manager, checkpoints.abstract_like(_state(0))
  )
  assert step == 2 and curriculum == {"cursor": 2, "memory": []}
  np.testing.assert_array_equal(state["params"]["w"], np.full((4, 3), 2.0))
  np.testing.assert_array_equal(state["rng"], jax.random.PRNGKey(2))

  # Corrupt every file of the newest step: restore falls back to step 1.
  newest = os.path.join(str(tmp_path), checkpoints.CHECKPOINT_DIR, "2")
  files = [
      p
      for p in glob.glob(newest + "/**/*", recursive=True)
      if os.path.isfile(p)
  ]
  assert files
  for p in files:
    with open(p, "wb") as f:
      f.write(b"\x00garbage")
  manager = checkpoints.make_manager(str(tmp_path), keep=3)
  step, state, curriculum = checkpoints.restore_latest(
      manager, checkpoints.abstract_like(_state(0))
  )
  assert step == 1 and curriculum["cursor"] == 1
  np.testing.assert_array_equal(state["params"]["w"], np.full((4, 3), 1.0))


def test_empty_workdir_has_nothing(tmp_path):
  manager = checkpoints.make_manager(str(tmp_path))
  assert checkpoints.restore_latest(manager, _state(0)) is None


def test_latest_params_reads_newest(tmp_path):
  from spade import config as config_lib  # pylint: disable=g-import-not-at-top

  manager = checkpoints.make_manager(str(tmp_path))
  assert (
      checkpoints.latest_params(config_lib.base_config(), str(tmp_path)) is None
  )
  for step in (1, 2):
    checkpoints.save(manager, step, _state(step), {})
  params = checkpoints.latest_params(config_lib.base_config(), str(tmp_path))
  np.testing.assert_array_equal(np.asarray(params["w"]), np.full((4, 3), 2.0))


def test_a_checkpoint_of_another_config_is_named_not_called_corrupt(tmp_path):
  """A state with LoRA adapters resumed by a run without them (or with other
  shapes): a CheckpointError that names the difference; the files stay."""
  import pytest  # pylint: disable=g-import-not-at-top

  manager = checkpoints.make_manager(str(tmp_path), keep=3)
  saved = dict(_state(1), adapters={"w": {"a": jnp.zeros((4, 2))}})
  checkpoints.save(manager, 1, saved, {"cursor": 1})
  manager = checkpoints.make_manager(str(tmp_path), keep=3)
  with pytest.raises(checkpoints.CheckpointError, match="lora_rank") as e:
    checkpoints.restore_latest(manager, checkpoints.abstract_like(_state(0)))
  assert "only in the checkpoint (first: adapters/w/a)" in str(e.value)
  other = dict(_state(0), params={"w": jnp.zeros((5, 3))})
  with pytest.raises(checkpoints.CheckpointError, match=r"\(4, 3\) saved"):
    checkpoints.restore_latest(
        manager,
        checkpoints.abstract_like(dict(other, adapters=saved["adapters"])),
    )
  # Nothing was deleted: the run it was written by still resumes.
  step, state, _ = checkpoints.restore_latest(
      manager, checkpoints.abstract_like(saved)
  )
  assert step == 1 and state["adapters"]["w"]["a"].shape == (4, 2)


def _heads_state(names):
  return {
      "params": {
          "heads": {n: {"unembedding": jnp.zeros((4, 3))} for n in names}
      },
      "step": jnp.asarray(0, jnp.int32),
  }


def test_a_checkpoint_of_the_other_heads_setting_names_the_key(tmp_path):
  """Written with separate heads, resumed or evaluated under the shared
  default (and the reverse): a CheckpointError that says which value of
  model.separate_heads builds the checkpoint's heads, not a KeyError."""
  import pytest  # pylint: disable=g-import-not-at-top
  from spade import config as config_lib  # pylint: disable=g-import-not-at-top

  separate = _heads_state(("designer", "agent"))
  manager = checkpoints.make_manager(str(tmp_path / "separate"))
  checkpoints.save(manager, 1, separate, {})
  shared = _heads_state(("shared",))
  with pytest.raises(
      checkpoints.CheckpointError, match=r"model\.separate_heads=True to use"
  ) as e:
    checkpoints.restore_latest(manager, checkpoints.abstract_like(shared))
  assert "heads/agent, heads/designer" in str(e.value)
  config = config_lib.base_config()
  assert not config.model.separate_heads
  with pytest.raises(
      checkpoints.CheckpointError, match=r"model\.separate_heads=True to use"
  ):
    checkpoints.latest_params(config, str(tmp_path / "separate"))
  config.model.separate_heads = True
  params = checkpoints.latest_params(config, str(tmp_path / "separate"))
  assert set(params["heads"]) == {"designer", "agent"}
  # The reverse: a shared-head checkpoint under separate_heads=True.
  manager = checkpoints.make_manager(str(tmp_path / "shared"))
  checkpoints.save(manager, 1, shared, {})
  with pytest.raises(
      checkpoints.CheckpointError, match=r"model\.separate_heads=False to use"
  ):
    checkpoints.restore_latest(manager, checkpoints.abstract_like(separate))
  with pytest.raises(
      checkpoints.CheckpointError, match=r"model\.separate_heads=False to use"
  ):
    checkpoints.latest_params(config, str(tmp_path / "shared"))
