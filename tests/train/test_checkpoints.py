"""Whole-state checkpoints: round trip, resume point, corrupt-latest fallback."""

import glob
import os
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts

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


def _big_state(megabytes_per_leaf: int = 64, leaves: int = 8):
  """Random float32 leaves (incompressible, as trained weights nearly are)."""
  n = megabytes_per_leaf * 2**20 // 4
  keys = jax.random.split(jax.random.PRNGKey(0), leaves)
  return {
      "params": {
          f"w{i}": jax.random.normal(k, (n // 1024, 1024))
          for i, k in enumerate(keys)
      },
      "step": jnp.asarray(3, jnp.int32),
  }


def _resident_gib() -> float:
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) / 2**20
  raise RuntimeError("no VmRSS in /proc/self/status")


def _peak_during(fn) -> float:
  """The most resident memory (GiB) seen every 5 ms while fn() runs."""
  peak, done = [_resident_gib()], threading.Event()

  def watch():
    while not done.is_set():
      peak.append(_resident_gib())
      time.sleep(0.005)

  watcher = threading.Thread(target=watch)
  watcher.start()
  try:
    fn()
  finally:
    done.set()
    watcher.join()
  return max(peak)


def test_a_save_holds_no_second_copy_of_the_state(tmp_path):
  """Issue 41: compressed, orbax encoded every array at once into buffers of
  its own, a second copy of the state while it was written (0.5 GiB here;
  the 1.5B's state, 6.6 GiB). Uncompressed, TensorStore writes from the
  arrays themselves."""
  state = jax.block_until_ready(_big_state())
  size = sum(x.nbytes for x in jax.tree.leaves(state)) / 2**30
  manager = checkpoints.make_manager(str(tmp_path))
  before = _resident_gib()
  peak = _peak_during(lambda: checkpoints.save(manager, 1, state, {}))
  assert peak - before < 0.1 * size, (before, peak, size)
  _, restored, _ = checkpoints.restore_latest(
      manager, checkpoints.abstract_like(state)
  )
  for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_state_arrays_are_stored_without_a_compressor(tmp_path):
  """What keeps the save's memory flat (`StateHandler`); orbax's standard
  handler would write zstd."""
  manager = checkpoints.make_manager(str(tmp_path))
  checkpoints.save(manager, 1, _state(1), {})
  base = os.path.join(str(tmp_path), checkpoints.CHECKPOINT_DIR, "1", "state")
  array = ts.open(
      {
          "driver": "zarr",
          "kvstore": {
              "driver": "ocdbt",
              "base": "file://" + base,
              "path": "params.w",
          },
      }
  ).result()
  assert array.spec().to_json()["metadata"]["compressor"] is None
  np.testing.assert_array_equal(array.read().result(), np.full((4, 3), 1.0))


def test_a_step_written_compressed_still_restores(tmp_path):
  """Workdirs saved before issue 41 (orbax's standard handler, zstd) resume
  bit for bit, and their metadata reads the same (`_differs`)."""
  directory = os.path.join(str(tmp_path), checkpoints.CHECKPOINT_DIR)
  old = ocp.CheckpointManager(
      directory,
      options=ocp.CheckpointManagerOptions(enable_async_checkpointing=False),
      item_handlers={
          "state": ocp.StandardCheckpointHandler(),
          "curriculum": ocp.JsonCheckpointHandler(),
      },
  )
  state = _state(1.25)
  checkpoints.save(old, 4, state, {"cursor": 4})
  manager = checkpoints.make_manager(str(tmp_path))
  step, restored, curriculum = checkpoints.restore_latest(
      manager, checkpoints.abstract_like(_state(0))
  )
  assert step == 4 and curriculum == {"cursor": 4}
  for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # A newer step, uncompressed, beside it; both restore.
  checkpoints.save(manager, 5, _state(2), {"cursor": 5})
  step, restored, _ = checkpoints.restore_latest(
      manager, checkpoints.abstract_like(_state(0))
  )
  assert step == 5
  np.testing.assert_array_equal(restored["params"]["w"], np.full((4, 3), 2.0))
