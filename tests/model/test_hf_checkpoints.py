"""Hugging Face checkpoints and the converted GGUF copy.

The parity tests build tiny random Gemma 3, Qwen2 and Qwen3 models with
`transformers` (the `hf` extra: torch CPU + transformers), save them with
`save_pretrained`, load the directory with our loader and compare both roles'
logits with transformers' on the same tokens. The other tests write the
directory with `safetensors.numpy` and need no torch: the config check, the
sharded load, the orbax round trip, and the converted GGUF copy (first load,
cached load, a corrupt copy rebuilt).
"""

import dataclasses
import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade import config as config_lib
from spade.model import architecture
from spade.model import converted_cache
from spade.model import gguf_tensors
from spade.model import hf
from spade.model import layout
from spade.model import loading
from spade.model import sharding
from spade.model import transformer
from spade.train import checkpoints as train_checkpoints

V, E, F, LAYERS, H, KV, D = 300, 64, 128, 2, 4, 2, 16

# Token rows longer than Gemma's test window (8), so the local layer masks.
TOKENS = np.array(
    [
        [2, 17, 250, 3, 99, 45, 45, 7, 280, 1, 64, 128, 5, 11],
        [2, 8, 9, 10, 299, 0, 33, 120, 77, 76, 75, 200, 150, 6],
    ],
    np.int32,
)


def _hf_config(family: str) -> dict:
  """A tiny config.json body for `family` (transformers' key names)."""
  common = dict(
      vocab_size=V,
      hidden_size=E,
      intermediate_size=F,
      num_hidden_layers=LAYERS,
      num_attention_heads=H,
      num_key_value_heads=KV,
      head_dim=D,
      rms_norm_eps=1e-6,
  )
  if family == "gemma3":
    return dict(
        common,
        model_type="gemma3_text",
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
        query_pre_attn_scalar=24,
        tie_word_embeddings=True,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
    )
  return dict(
      common,
      model_type=family,
      # Qwen2 tied and Qwen3 untied: both head sources are covered.
      tie_word_embeddings=family == "qwen2",
      rope_parameters={"rope_type": "default", "rope_theta": 1e6},
  )


def _scaled_gemma3(rope_type: str) -> dict:
  """The tiny Gemma 3 body with its global layers' RoPE scaled by 8."""
  body = _hf_config("gemma3")
  body["rope_parameters"]["full_attention"] = {
      "rope_type": rope_type,
      "factor": 8.0,
      "rope_theta": 1e6,
  }
  return body


def _model_config(family: str, body=None) -> architecture.ModelConfig:
  derived = hf.model_config_from_hf(hf.text_config(body or _hf_config(family)))
  return architecture.ModelConfig(
      **{k: v for k, v in derived.items() if not k.startswith("_")}
  )


@functools.lru_cache(maxsize=None)
def _forward(cfg: architecture.ModelConfig):
  """Both roles' logits in one compiled function per model config."""
  model = transformer.build_model(cfg)

  def both(params, tokens):
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    return tuple(
        model.apply({"params": params}, tokens, positions, role)[0]
        for role in transformer.Role
    )

  return jax.jit(both)


def _logits(params, cfg, tokens=TOKENS):
  """[designer logits, agent logits] as numpy float32."""
  return [np.asarray(x) for x in _forward(cfg)(params, jnp.asarray(tokens))]


# ---------------------------------------------------------------------------
# Parity with transformers.


def _write_with_transformers(family: str, directory: str, body=None):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  body = body or _hf_config(family)
  if family == "gemma3":
    config = transformers.Gemma3TextConfig(
        **{k: v for k, v in body.items() if k != "model_type"}
    )
    cls = transformers.Gemma3ForCausalLM
  elif family == "qwen2":
    body = {k: v for k, v in body.items() if k != "head_dim"}
    config = transformers.Qwen2Config(
        **{k: v for k, v in body.items() if k != "model_type"}
    )
    cls = transformers.Qwen2ForCausalLM
  else:
    config = transformers.Qwen3Config(
        **{k: v for k, v in body.items() if k != "model_type"}
    )
    cls = transformers.Qwen3ForCausalLM
  config._attn_implementation = "eager"  # pylint: disable=protected-access
  torch.manual_seed(0)
  model = cls(config).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      # Random norms and biases: ones and zeros would hide a wrong +1 or a
      # dropped bias.
      if "norm" in name:
        base = 0.0 if family == "gemma3" else 1.0
        p.copy_(base + 0.3 * torch.randn_like(p))
      elif name.endswith("bias"):
        p.copy_(0.1 * torch.randn_like(p))
  model.save_pretrained(directory)
  with torch.no_grad():
    logits = model(torch.tensor(TOKENS, dtype=torch.long)).logits
  return logits.float().numpy()


@pytest.mark.parametrize("family", ["gemma3", "qwen2", "qwen3"])
def test_logits_equal_transformers(family, tmp_path):
  want = _write_with_transformers(family, str(tmp_path))
  cfg = _model_config(family)
  params = hf.hf_params(str(tmp_path), cfg)
  for got in _logits(params, cfg):  # the designer's head, then the agent's
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_gemma3_linear_rope_scaling_equals_transformers(tmp_path):
  # Gemma 3 4B and up scale the global layers' RoPE linearly by 8.
  body = _scaled_gemma3("linear")
  want = _write_with_transformers("gemma3", str(tmp_path), body)
  cfg = _model_config("gemma3", body)
  assert cfg.rope_global_scale == 8.0
  params = hf.hf_params(str(tmp_path), cfg)
  for got in _logits(params, cfg):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  # The scale is what makes them equal: unscaled, the logits differ.
  unscaled = dataclasses.replace(cfg, rope_global_scale=1.0)
  assert np.abs(_logits(params, unscaled)[1] - want).max() > 1e-2


def test_gemma3_multimodal_names_load_the_text_part(tmp_path):
  # Gemma3ForConditionalGeneration: the text model under
  # model.language_model, a vision tower beside it, an outer config.
  tensors = _numpy_tensors("gemma3", seed=3)
  renamed = {
      k.replace("model.", "model.language_model.", 1): v
      for k, v in tensors.items()
  }
  renamed["model.vision_tower.vision_model.encoder.layers.0.fc1.weight"] = (
      np.ones((4, 4), np.float32)
  )
  text = _hf_config("gemma3")
  outer = {"model_type": "gemma3", "text_config": text}
  _write_numpy(tmp_path / "mm", outer, renamed)
  _write_numpy(tmp_path / "text", text, tensors)
  cfg = _model_config("gemma3")
  a = hf.hf_params(str(tmp_path / "mm"), cfg)
  b = hf.hf_params(str(tmp_path / "text"), cfg)
  jax.tree.map(np.testing.assert_array_equal, a, b)


# ---------------------------------------------------------------------------
# Directories written with safetensors.numpy (no torch).


def _numpy_tensors(family: str, seed: int = 0) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(seed)
  r = lambda *s: rng.normal(size=s).astype(np.float32) * 0.2
  t = {"model.embed_tokens.weight": r(V, E), "model.norm.weight": r(E)}
  if family == "qwen3":
    t["lm_head.weight"] = r(V, E)
  for i in range(LAYERS):
    p = f"model.layers.{i}."
    t[p + "input_layernorm.weight"] = r(E)
    t[p + "post_attention_layernorm.weight"] = r(E)
    t[p + "self_attn.q_proj.weight"] = r(H * D, E)
    t[p + "self_attn.k_proj.weight"] = r(KV * D, E)
    t[p + "self_attn.v_proj.weight"] = r(KV * D, E)
    t[p + "self_attn.o_proj.weight"] = r(E, H * D)
    for proj in ("gate", "up"):
      t[p + f"mlp.{proj}_proj.weight"] = r(F, E)
    t[p + "mlp.down_proj.weight"] = r(E, F)
    if family in ("gemma3", "qwen3"):
      t[p + "self_attn.q_norm.weight"] = r(D)
      t[p + "self_attn.k_norm.weight"] = r(D)
    if family == "gemma3":
      t[p + "pre_feedforward_layernorm.weight"] = r(E)
      t[p + "post_feedforward_layernorm.weight"] = r(E)
    if family == "qwen2":
      for proj, n in (("q", H), ("k", KV), ("v", KV)):
        t[p + f"self_attn.{proj}_proj.bias"] = r(n * D)
  return t


def _write_numpy(directory, config_body: dict, tensors, shards: int = 1):
  safetensors_numpy = pytest.importorskip("safetensors.numpy")
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(config_body, f)
  names = sorted(tensors)
  weight_map = {}
  for s in range(shards):
    part = names[s::shards]
    file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
    safetensors_numpy.save_file(
        {n: tensors[n] for n in part}, os.path.join(directory, file)
    )
    weight_map.update({n: file for n in part})
  if shards > 1:
    with open(
        os.path.join(directory, "model.safetensors.index.json"), "w"
    ) as f:
      json.dump({"metadata": {}, "weight_map": weight_map}, f)
  return str(directory)


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
  directory = tmp_path_factory.mktemp("qwen3")
  return _write_numpy(
      directory, _hf_config("qwen3"), _numpy_tensors("qwen3"), shards=3
  )


def test_sharded_index_maps_every_tensor(qwen3_dir):
  tensors = _numpy_tensors("qwen3")
  cfg = _model_config("qwen3")
  params = hf.hf_params(qwen3_dir, cfg)
  layers = layout.to_per_layer_layout(params, cfg)
  q = tensors["model.layers.1.self_attn.q_proj.weight"]
  np.testing.assert_array_equal(
      layers["layer_1"]["attn"]["q_proj"]["kernel"], q.T.reshape(E, H, D)
  )
  o = tensors["model.layers.0.self_attn.o_proj.weight"]
  np.testing.assert_array_equal(
      layers["layer_0"]["attn"]["o_proj"]["kernel"], o.T.reshape(H, D, E)
  )
  # Qwen norms are the full multiplier: stored as is.
  np.testing.assert_array_equal(
      layers["layer_0"]["pre_ffw_norm"]["scale"],
      tensors["model.layers.0.post_attention_layernorm.weight"],
  )
  assert set(params["heads"]) == {"shared"}
  np.testing.assert_array_equal(
      params["heads"]["shared"]["unembedding"], tensors["lm_head.weight"]
  )
  # With separate heads, each is lm_head in a buffer of its own.
  heads = hf.hf_params(
      qwen3_dir, dataclasses.replace(cfg, separate_heads=True)
  )["heads"]
  assert set(heads) == {"designer", "agent"}
  for role in ("designer", "agent"):
    np.testing.assert_array_equal(
        heads[role]["unembedding"], tensors["lm_head.weight"]
    )
  assert (
      heads["designer"]["unembedding"].unsafe_buffer_pointer()
      != heads["agent"]["unembedding"].unsafe_buffer_pointer()
  )


def test_load_on_a_mesh_shards_each_tensor(qwen3_dir):
  cfg = _model_config("qwen3")
  mesh_config = config_lib.base_config().mesh
  mesh_config.data, mesh_config.fsdp, mesh_config.tensor = 1, 4, 2
  mesh = sharding.make_mesh(mesh_config)
  rules = mesh_config.rules
  placed = hf.hf_params(qwen3_dir, cfg, mesh, rules)
  plain = hf.hf_params(qwen3_dir, cfg)
  want = sharding.fitted_param_shardings(placed, mesh, rules)
  for got, spec in zip(jax.tree.leaves(placed), jax.tree.leaves(want)):
    assert got.sharding.is_equivalent_to(spec, got.ndim)
  table = placed["heads"]["shared"]["unembedding"]  # [V=300, E=64]
  shard = table.addressable_shards[0].data
  assert shard.size < table.size  # no device holds the whole table
  jax.tree.map(np.testing.assert_array_equal, placed, plain)


def test_config_mismatch_names_every_key(qwen3_dir):
  cfg = _model_config("qwen3")
  wrong = architecture.ModelConfig(
      **{**cfg.__dict__, "num_layers": 3, "mlp_dim": 96, "qk_norm": False}
  )
  with pytest.raises(hf.CheckpointFileError) as e:
    hf.hf_params(qwen3_dir, wrong)
  for key in ("num_layers=2", "mlp_dim=128", "qk_norm=True"):
    assert key in str(e.value)


def test_unsupported_rope_scaling_is_an_error(tmp_path):
  body = _scaled_gemma3("yarn")
  path = _write_numpy(tmp_path, body, _numpy_tensors("gemma3"))
  with pytest.raises(hf.CheckpointFileError, match="yarn"):
    hf.hf_params(path, _model_config("gemma3"))


def test_missing_tensor_is_named(tmp_path):
  tensors = _numpy_tensors("qwen2")
  del tensors["model.layers.1.self_attn.k_proj.bias"]
  path = _write_numpy(tmp_path, _hf_config("qwen2"), tensors)
  with pytest.raises(hf.CheckpointFileError, match="layer_1/attn/k_proj/bias"):
    hf.hf_params(path, _model_config("qwen2"))


def test_truncated_file_is_named(tmp_path):
  path = _write_numpy(tmp_path, _hf_config("qwen2"), _numpy_tensors("qwen2"))
  file = os.path.join(path, "model-00001-of-00001.safetensors")
  data = open(file, "rb").read()
  with open(file, "wb") as f:
    f.write(data[: len(data) - 100])
  with pytest.raises(hf.CheckpointFileError, match="truncated"):
    hf.hf_params(path, _model_config("qwen2"))


def test_orbax_round_trip_gives_the_same_logits(qwen3_dir, tmp_path):
  cfg = _model_config("qwen3")
  params = hf.hf_params(qwen3_dir, cfg)
  manager = train_checkpoints.make_manager(str(tmp_path))
  train_checkpoints.save(manager, 0, params, {"source": qwen3_dir})
  abstract = train_checkpoints.abstract_like(params)
  step, restored, curriculum = train_checkpoints.restore_latest(
      train_checkpoints.make_manager(str(tmp_path)), abstract
  )
  assert step == 0 and curriculum == {"source": qwen3_dir}
  for got, want in zip(_logits(restored, cfg), _logits(params, cfg)):
    np.testing.assert_array_equal(got, want)


def test_hf_kind_through_initial_params(qwen3_dir):
  config = config_lib.base_config()
  derived = hf.model_config_from_hf(hf.text_config(_hf_config("qwen3")))
  config.model.update(
      {k: v for k, v in derived.items() if not k.startswith("_")}
  )
  config.checkpoint.kind = "hf"
  config.checkpoint.path = qwen3_dir
  config_lib.validate(config)
  params = loading.initial_params(config)
  direct = hf.hf_params(qwen3_dir, config.model)
  jax.tree.map(np.testing.assert_array_equal, params, direct)
  # On a mesh every tensor arrives in its shards (the engine's start).
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 1, 4, 2
  mesh = sharding.make_mesh(config.mesh)
  placed = loading.initial_params(config, None, mesh, config.mesh.rules)
  table = placed["heads"]["shared"]["unembedding"]
  assert table.addressable_shards[0].data.size < table.size
  jax.tree.map(np.testing.assert_array_equal, placed, direct)


def test_engine_reads_its_checkpoint_onto_its_mesh(qwen3_dir, monkeypatch):
  """The engine hands its mesh to the loader, so no device ever receives a
  whole checkpoint (before, every tensor landed on device 0 first)."""
  from spade.selfplay import engine as engine_lib  # pylint: disable=g-import-not-at-top

  seen = []
  real = loading.load_checkpoint

  def spy(config, mesh=None, rules=()):
    seen.append(mesh)
    return real(config, mesh, rules)

  monkeypatch.setattr(loading, "load_checkpoint", spy)
  config = config_lib.base_config()
  derived = hf.model_config_from_hf(hf.text_config(_hf_config("qwen3")))
  config.model.update(
      {k: v for k, v in derived.items() if not k.startswith("_")}
  )
  config.checkpoint.kind, config.checkpoint.path = "hf", qwen3_dir
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 1, 4, 2
  engine = engine_lib.Engine(config)
  assert len(seen) == 1 and seen[0] is engine.mesh


def test_qwen3_shapes_match_the_published_sizes():
  eight = architecture.qwen3_shapes("8b")
  assert (eight["num_layers"], eight["embed_dim"], eight["mlp_dim"]) == (
      36,
      4096,
      12288,
  )
  assert not eight["tie_embeddings"]
  four = architecture.qwen3_shapes("4b")
  assert (four["embed_dim"], four["mlp_dim"], four["tie_embeddings"]) == (
      2560,
      9728,
      True,
  )
  with pytest.raises(ValueError, match="0.6b"):
    architecture.qwen3_shapes("14b")


# ---------------------------------------------------------------------------
# The converted copy of a GGUF file.


@pytest.fixture
def gguf_config(tmp_path, monkeypatch):
  from tests.model import test_checkpoints as gguf_tests  # pylint: disable=g-import-not-at-top

  monkeypatch.setenv("SPADE_CACHE", str(tmp_path / "cache"))
  monkeypatch.setattr(converted_cache, "MIN_CACHED_BYTES", 0)
  config = gguf_tests._config("qwen2")  # pylint: disable=protected-access
  config.checkpoint.path = gguf_tests._write(  # pylint: disable=protected-access
      tmp_path / "tiny.gguf", "qwen2", gguf_tests._tensors("qwen2")  # pylint: disable=protected-access
  )
  return config


def _converted_dirs(config):
  root = os.path.join(os.environ["SPADE_CACHE"], "converted")
  return sorted(os.listdir(root)) if os.path.isdir(root) else []


def test_converted_copy_is_kept_and_restored(gguf_config, capfd):
  direct = layout.to_model_layout(
      gguf_tensors.gguf_params(
          gguf_config.checkpoint.path, gguf_config.model, "qwen2_gguf"
      ),
      gguf_config.model,
  )
  first = loading.initial_params(gguf_config)
  assert "kept a copy" in capfd.readouterr().err
  assert len(_converted_dirs(gguf_config)) == 1
  second = loading.initial_params(gguf_config)
  assert "loaded" in capfd.readouterr().err
  jax.tree.map(np.testing.assert_array_equal, first, direct)
  jax.tree.map(np.testing.assert_array_equal, second, direct)
  # Separate heads are built from the same copy (the file stores the
  # output layer once, under the name copies before the key had).
  gguf_config.model.separate_heads = True
  separate = loading.initial_params(gguf_config)
  assert "loaded" in capfd.readouterr().err
  assert len(_converted_dirs(gguf_config)) == 1
  assert set(separate["heads"]) == {"designer", "agent"}
  for head in separate["heads"].values():
    np.testing.assert_array_equal(
        head["unembedding"], direct["heads"]["shared"]["unembedding"]
    )
  # A changed model config is another copy, not a wrong one.
  gguf_config.model.norm_eps = 1e-5
  loading.initial_params(gguf_config)
  assert len(_converted_dirs(gguf_config)) == 2


@pytest.mark.parametrize("damage", ["zero_bytes", "truncate"])
def test_corrupt_copy_is_reported_and_rebuilt(gguf_config, capfd, damage):
  first = loading.initial_params(gguf_config)
  (name,) = _converted_dirs(gguf_config)
  file = os.path.join(os.environ["SPADE_CACHE"], "converted", name)
  size = os.path.getsize(file)
  if damage == "zero_bytes":
    with open(file, "r+b") as f:
      f.seek(size // 2)
      f.write(b"\0" * 64)
  else:
    os.truncate(file, size - 1000)
  capfd.readouterr()
  second = loading.initial_params(gguf_config)
  err = capfd.readouterr().err
  assert "corrupt" in err and "rebuilding" in err
  jax.tree.map(np.testing.assert_array_equal, first, second)
  third = loading.initial_params(gguf_config)
  assert "loaded" in capfd.readouterr().err
  jax.tree.map(np.testing.assert_array_equal, first, third)


# ---------------------------------------------------------------------------
# The Qwen tokenizer from tokenizer.json.


def _write_qwen_tokenizer(directory) -> None:
  """A small tokenizer.json in Qwen2's layout: byte-level BPE, ChatML."""
  from spade.model import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top

  alphabet = sorted(tokenizer_lib._byte_to_unicode().values())  # pylint: disable=protected-access
  merges = [["Ġ", "t"], ["h", "e"], ["Ġt", "he"], ["i", "n"], ["Ġ", "c"]]
  vocab = {c: i for i, c in enumerate(alphabet)}
  for a, b in merges:
    vocab[a + b] = len(vocab)
  added = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
  byte_level = {
      "type": "ByteLevel",
      "add_prefix_space": False,
      "trim_offsets": False,
      "use_regex": False,
  }
  body = {
      "version": "1.0",
      "truncation": None,
      "padding": None,
      "added_tokens": [
          {
              "id": len(vocab) + j,
              "content": token,
              "single_word": False,
              "lstrip": False,
              "rstrip": False,
              "normalized": False,
              "special": True,
          }
          for j, token in enumerate(added)
      ],
      "normalizer": {"type": "NFC"},
      "pre_tokenizer": {
          "type": "Sequence",
          "pretokenizers": [
              {
                  "type": "Split",
                  "pattern": {"Regex": tokenizer_lib._QWEN2_PATTERN},  # pylint: disable=protected-access
                  "behavior": "Isolated",
                  "invert": False,
              },
              byte_level,
          ],
      },
      "post_processor": byte_level,
      "decoder": byte_level,
      "model": {
          "type": "BPE",
          "dropout": None,
          "unk_token": None,
          "continuing_subword_prefix": "",
          "end_of_word_suffix": "",
          "fuse_unk": False,
          "byte_fallback": False,
          "ignore_merges": False,
          "vocab": vocab,
          "merges": merges,
      },
  }
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "tokenizer.json"), "w") as f:
    json.dump(body, f)
  with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
    json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, f)


def test_qwen_tokenizer_from_tokenizer_json(tmp_path):
  from spade.model import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top

  _write_qwen_tokenizer(tmp_path)
  config = config_lib.base_config()
  config.checkpoint.kind = "hf"
  config.checkpoint.path = str(tmp_path)
  config.tokenizer.kind = "qwen_bpe"
  ours = tokenizer_lib.build_tokenizer(config)
  n = 256 + 5
  assert (ours.eos_id, ours.pad_id, ours.vocab_size) == (n + 2, n, n + 3)
  assert ours.stop_ids[0] == n + 2
  texts = [
      "the cat in the hat",
      "<|im_start|>user\nthe thin cat<|im_end|>\n  tea, 42!",
      "caf\u00e9 \u4e2d\u6587 \U0001f600 x",
  ]
  tokenizers = pytest.importorskip("tokenizers")
  reference = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
  for text in texts:
    ids = ours.encode(text)
    assert ids == reference.encode(text, add_special_tokens=False).ids
    assert ours.decode(ids, skip_special=False) == text
  assert ours.encode(" the") == [n - 3]  # "Ġthe": the merges apply
