"""Config validation: bad keys, types and combinations are one-line errors."""

import os
import subprocess
import sys

import pytest

from spade import config as config_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(
    f[:-3]
    for f in os.listdir(os.path.join(ROOT, "configs"))
    if f.endswith(".py") and not f.startswith("_")
)


def _load(name, arg=None):
  import importlib.util  # pylint: disable=g-import-not-at-top

  spec = importlib.util.spec_from_file_location(
      name, os.path.join(ROOT, "configs", name + ".py")
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


@pytest.mark.parametrize("name", CONFIGS)
def test_every_config_validates(name):
  config_lib.validate(_load(name))


@pytest.mark.parametrize("name", CONFIGS)
def test_unknown_variant_names_its_file(name):
  with pytest.raises(ValueError, match=f"configs/{name}.py has no variant"):
    _load(name, "no_such_variant")


def test_unknown_key_rejected():
  c = _load("tiny")
  c.model.unlock()
  c.model.no_such_key = 1
  with pytest.raises(config_lib.ConfigError, match="model.no_such_key"):
    config_lib.validate(c)


def test_wrong_type_rejected():
  c = _load("tiny")
  agent = c.agent.to_dict()
  agent["max_turns"] = "three"  # ConfigDict types assignments; a file may not
  c.agent = config_lib.ConfigDict(agent)
  with pytest.raises(config_lib.ConfigError, match="agent.max_turns"):
    config_lib.validate(c)


def test_impossible_combination_rejected():
  c = _load("tiny")
  c.model.num_kv_heads = 3
  with pytest.raises(config_lib.ConfigError, match="num_kv_heads"):
    config_lib.validate(c)


@pytest.mark.parametrize(
    "key, value, needle",
    [
        ("agent.retry_failed_plays", -1, "retry_failed_plays=-1 must be >= 0"),
        ("sampling.prefill_chunk", -8, "prefill_chunk=-8 must be >= 0"),
        ("optim.lora_rank", -2, "lora_rank=-2 must be >= 0"),
        ("optim.global_batch_size", -1, "global_batch_size=-1 must be >= 0"),
    ],
)
def test_negative_sizes_rejected(key, value, needle):
  c = _load("tiny")
  section, name = key.split(".")
  c[section][name] = value
  with pytest.raises(config_lib.ConfigError, match=needle):
    config_lib.validate(c)


def test_smoke_variant_is_smaller():
  assert _load("tiny", "smoke").num_iterations == 1


@pytest.mark.parametrize(
    "override, needle",
    [
        ("--config.no_such_key=1", "no_such_key"),
        ("--config.model.num_layers=abc", "num_layers"),
        ("--config.sandbox.backend=docker", "sandbox.backend"),
    ],
)
def test_cli_one_line_error(override, needle, tmp_path):
  proc = subprocess.run(
      [
          sys.executable,
          "-m",
          "spade.main",
          "--config=configs/tiny.py",
          override,
          f"--workdir={tmp_path}",
      ],
      cwd=ROOT,
      capture_output=True,
      text=True,
      check=False,
  )
  assert proc.returncode != 0
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1, proc.stderr
  assert needle in lines[0]
  assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "arg", ["1b", "4b", "12b", "27b", "1b,runlocal", "27b,runlocal"]
)
def test_gemma3_tpu_reaches_every_size(arg):
  c = _load("gemma3_tpu", arg)
  config_lib.validate(c)
  size = arg.split(",")[0]
  layers = {"1b": 26, "4b": 34, "12b": 48, "27b": 62}[size]
  assert c.model.num_layers == (2 if "runlocal" in arg else layers)


@pytest.mark.parametrize(
    "arg",
    [
        "qwen3_4b,8x80gb",
        "qwen3_8b,8x80gb",
        "gemma3_27b,8x80gb",
        "gemma3_4b,1x141gb",
        "qwen3_8b,1x141gb",
        "qwen3_4b,8x80gb,runlocal",
        "gemma3_1b,1x141gb,runlocal",
    ],
)
def test_gpu_configs_size_each_node(arg):
  c = _load("gpu", arg)
  config_lib.validate(c)
  model, node = arg.split(",")[:2]
  # The TPU configs' layout fixes, measured on TPU only, are off.
  assert c.model.decode_mlp_pad_rows == 0
  assert dict(c.mesh.rules)["decode_residual"] is None
  assert c.model.decode_mlp_kernel == "xla"
  if "runlocal" in arg:
    assert c.model.num_layers == 2 and c.sampling.slots % 8 == 0
    return
  # One node's devices: 8 GPUs, or one.
  assert c.mesh.fsdp * c.mesh.tensor == (8 if node == "8x80gb" else 1)
  assert c.sampling.slots % (8 if node == "8x80gb" else 1) == 0
  # The TPU config's rollouts: the reference's 24 environments, 25 turns.
  assert c.designer.num_envs == 24 and c.agent.max_turns == 25
  big = model in ("gemma3_27b",) or (node == "1x141gb" and model == "qwen3_8b")
  assert (c.optim.lora_rank > 0) == big


def test_gpu_config_refuses_what_one_gpu_cannot_hold():
  with pytest.raises(ValueError, match="does not fit one 141 GB GPU"):
    _load("gpu", "gemma3_12b,1x141gb")


def test_the_recipe_has_the_references_optimizer_and_the_base_says_which_not():
  # cmd/games/train_spade_30b.sh: --lr 1e-6 --weight-decay 0.1
  # --adam-beta1 0.9 --adam-beta2 0.98; the README names the base's three
  # exceptions.
  recipe = _load("reference_recipe").optim
  assert (recipe.learning_rate, recipe.weight_decay) == (1e-6, 0.1)
  assert (recipe.b1, recipe.b2) == (0.9, 0.98)
  assert recipe.weight_decay_mask == "megatron"
  assert recipe.loss_reduction == "sample_mean"
  # --global-batch-size 192: the update's batch in samples.
  assert recipe.global_batch_size == 192
  assert config_lib.base_config().optim.global_batch_size == 192
  base = config_lib.base_config().optim
  assert (base.learning_rate, base.weight_decay, base.b2) == (1e-5, 0.0, 0.999)
  with open(os.path.join(ROOT, "README.md")) as f:
    readme = " ".join(f.read().split())
  for words in ("learning rate 1e-5", "weight decay 0", "b2 0.999"):
    assert words in readme, words


def test_failed_plays_are_retried_once_and_hung_games_blacklisted():
  """The reference plays a failed play again once (`play_games_async`,
  `max_attempts=2`) and keeps a game that hung out of later plays
  (`_hung_game_blacklist`, core/orchestrator.py)."""
  for c in (config_lib.base_config(), _load("reference_recipe")):
    assert c.agent.retry_failed_plays == 1
    assert c.environments.blacklist_hung is True


def test_one_output_layer_for_both_roles_is_the_default():
  """The reference trains one model, its output layer included
  (`spade/slime/spade_rollout.py` builds one model adapter for designs and
  plays); per-role heads are the option."""
  from spade.model import transformer  # pylint: disable=g-import-not-at-top

  base = config_lib.base_config()
  assert base.model.separate_heads is False
  assert _load("reference_recipe").model.separate_heads is False
  assert transformer.head_names(base.model) == ("shared",)
  base.model.separate_heads = True
  config_lib.validate(base)
  assert transformer.head_names(base.model) == ("designer", "agent")


def test_a_global_batch_is_refused_with_the_token_mean():
  # The batch's samples divide only slime's sum of sample means.
  c = config_lib.base_config()
  c.optim.loss_reduction = "token_mean"
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(c)
  message = str(e.value)
  assert "\n" not in message
  assert "optim.global_batch_size=192" in message
  assert "optim.loss_reduction" in message and "token_mean" in message
  c.optim.global_batch_size = 0
  config_lib.validate(c)
