"""GGUF loading: name mapping, dequantisation, heads, and clear file errors.

Synthetic GGUF files written with `gguf.GGUFWriter` (tiny shapes, llama.cpp
tensor names, one Q8_0 tensor) stand in for the real checkpoints, so these
tests run in seconds; `test_hf_parity.py` covers the real files.
"""

import os

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade import config as config_lib
from spade.model import gguf_files
from spade.model import gguf_tensors
from spade.model import layers
from spade.model import loading
from spade.model import transformer

E, H, KV, D, F, V, LAYERS = 32, 2, 1, 16, 64, 64, 2


def _config(family: str):
  c = config_lib.base_config()
  m = c.model
  m.family = family
  m.vocab_size, m.embed_dim, m.num_layers = V, E, LAYERS
  m.num_heads, m.num_kv_heads, m.head_dim, m.mlp_dim = H, KV, D, F
  if family == "qwen2":
    m.qk_norm, m.qkv_bias, m.mlp_activation = False, True, "silu"
    m.scale_embeddings, m.tie_embeddings, m.sliding_window = False, False, 0
    c.checkpoint.kind = "qwen2_gguf"
  else:
    m.sliding_window, m.global_every = 4, 2
    c.checkpoint.kind = "gemma3_gguf"
  return c


def _tensors(family: str, seed: int = 0) -> dict[str, np.ndarray]:
  """llama.cpp-named float32 tensors, in GGUF's row-major [out, in] order."""
  rng = np.random.default_rng(seed)

  def r(*shape):
    return rng.normal(size=shape).astype(np.float32)

  t = {"token_embd.weight": r(V, E), "output_norm.weight": r(E)}
  if family == "qwen2":
    t["output.weight"] = r(V, E)
  for i in range(LAYERS):
    p = f"blk.{i}."
    t[p + "attn_norm.weight"] = r(E)
    t[p + "attn_q.weight"] = r(H * D, E)
    t[p + "attn_k.weight"] = r(KV * D, E)
    t[p + "attn_v.weight"] = r(KV * D, E)
    t[p + "attn_output.weight"] = r(E, H * D)
    t[p + "ffn_norm.weight"] = r(E)
    t[p + "ffn_gate.weight"] = r(F, E)
    t[p + "ffn_up.weight"] = r(F, E)
    t[p + "ffn_down.weight"] = r(E, F)
    if family == "qwen2":
      t[p + "attn_q.bias"] = r(H * D)
      t[p + "attn_k.bias"] = r(KV * D)
      t[p + "attn_v.bias"] = r(KV * D)
    else:
      t[p + "attn_q_norm.weight"] = r(D)
      t[p + "attn_k_norm.weight"] = r(D)
      t[p + "post_attention_norm.weight"] = r(E)
      t[p + "post_ffw_norm.weight"] = r(E)
  return t


def _write(path, family: str, tensors, quantize=(), rope_scale=None) -> str:
  arch = family
  w = gguf.GGUFWriter(str(path), arch)
  if rope_scale is not None:  # what llama.cpp writes for Gemma 3 4B+
    w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    w.add_rope_scaling_factor(rope_scale)
  w.add_block_count(LAYERS)
  w.add_embedding_length(E)
  w.add_feed_forward_length(F)
  w.add_head_count(H)
  w.add_head_count_kv(KV)
  w.add_context_length(128)
  for name, value in tensors.items():
    if name in quantize:
      q = gguf.quants.quantize(value, gguf.GGMLQuantizationType.Q8_0)
      w.add_tensor(name, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    else:
      w.add_tensor(name, value)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return str(path)


@pytest.fixture(scope="module")
def gemma_file(tmp_path_factory):
  tensors = _tensors("gemma3")
  path = tmp_path_factory.mktemp("gguf") / "tiny_gemma.gguf"
  return _write(path, "gemma3", tensors, quantize=("blk.0.ffn_up.weight",))


@pytest.fixture(scope="module")
def qwen_file(tmp_path_factory):
  path = tmp_path_factory.mktemp("gguf") / "tiny_qwen.gguf"
  return _write(path, "qwen2", _tensors("qwen2", seed=1))


def test_gemma_mapping_places_every_tensor(gemma_file):
  t = _tensors("gemma3")
  p = gguf_tensors.gguf_params(
      gemma_file, _config("gemma3").model, "gemma3_gguf"
  )
  layer = p["layer_1"]
  # q: row h*D+d of the [H*D, E] matrix is kernel[:, h, d].
  q = t["blk.1.attn_q.weight"]
  np.testing.assert_array_equal(layer["attn"]["q_proj"]["kernel"][:, 1, 3],
                                q[1 * D + 3])  # fmt: skip
  o = t["blk.1.attn_output.weight"]
  np.testing.assert_array_equal(layer["attn"]["o_proj"]["kernel"][1, 5],
                                o[:, 1 * D + 5])  # fmt: skip
  np.testing.assert_array_equal(layer["mlp"]["down"]["kernel"],
                                t["blk.1.ffn_down.weight"].T)  # fmt: skip
  # Norm weights go in exactly as stored (llama.cpp already added Gemma's +1).
  np.testing.assert_array_equal(layer["pre_attention_norm"]["scale"],
                                t["blk.1.attn_norm.weight"])  # fmt: skip
  np.testing.assert_array_equal(layer["post_ffw_norm"]["scale"],
                                t["blk.1.post_ffw_norm.weight"])  # fmt: skip
  np.testing.assert_array_equal(layer["attn"]["k_norm"]["scale"],
                                t["blk.1.attn_k_norm.weight"])  # fmt: skip
  # The Q8_0 tensor is dequantized: close to the original, not equal.
  up = p["layer_0"]["mlp"]["up"]["kernel"]
  ref = t["blk.0.ffn_up.weight"].T
  assert not np.array_equal(up, ref)
  np.testing.assert_allclose(up, ref, atol=0.03)


@pytest.mark.parametrize(
    "separate, names", [(False, {"shared"}), (True, {"designer", "agent"})]
)
def test_tied_checkpoint_gives_every_head_the_embedding(
    gemma_file, separate, names
):
  """One shared head by default, one per role with `separate_heads`; each a
  buffer of its own, equal to the input embedding."""
  config = _config("gemma3")
  config.model.separate_heads = separate
  p = gguf_tensors.gguf_params(gemma_file, config.model, "gemma3_gguf")
  assert set(p["heads"]) == names
  emb = p["embedder"]["input_embedding"]
  tables = [head["unembedding"] for head in p["heads"].values()]
  for table in tables:
    np.testing.assert_array_equal(table, emb)
    assert not np.shares_memory(table, emb)
  if separate:
    assert not np.shares_memory(*tables)


def test_qwen_biases_and_separate_output_layer(qwen_file):
  t = _tensors("qwen2", seed=1)
  p = gguf_tensors.gguf_params(qwen_file, _config("qwen2").model, "qwen2_gguf")
  attn = p["layer_0"]["attn"]
  np.testing.assert_array_equal(attn["k_proj"]["bias"],
                                t["blk.0.attn_k.bias"].reshape(KV, D))  # fmt: skip
  np.testing.assert_array_equal(attn["q_proj"]["bias"][1],
                                t["blk.0.attn_q.bias"][D:])  # fmt: skip
  assert set(p["heads"]) == {"shared"}
  np.testing.assert_array_equal(p["heads"]["shared"]["unembedding"],
                                t["output.weight"])  # fmt: skip
  assert "q_norm" not in attn and "post_ffw_norm" not in p["layer_0"]


@pytest.mark.parametrize("family", ["gemma3", "qwen2"])
def test_loaded_tree_matches_the_model_and_runs(family, gemma_file, qwen_file):
  config = _config(family)
  config.checkpoint.path = gemma_file if family == "gemma3" else qwen_file
  params = loading.initial_params(config)
  scratch = transformer.init_params(config.model, jax.random.PRNGKey(0))
  shapes = lambda tree: jax.tree.map(lambda x: (x.shape, x.dtype), tree)
  assert shapes(params) == shapes(scratch)
  model = transformer.build_model(config.model)
  tokens = jnp.array([[1, 5, 9, 2]], jnp.int32)
  positions = jnp.arange(4)[None]
  logits, _ = model.apply(
      {"params": params}, tokens, positions, transformer.Role.AGENT
  )
  assert logits.shape == (1, 4, V)
  assert bool(jnp.all(jnp.isfinite(logits)))


def test_out_in_layout_loads_the_same_weights_transposed(qwen_file):
  # `model.kernel_layout="out_in"` transposes each kernel as it is read
  # (a view of the file's tensor until then): the in_out load, transposed.
  config = _config("qwen2")
  config.checkpoint.path = qwen_file
  want = layers.kernels_out_in(loading.initial_params(config))
  config.model.kernel_layout = "out_in"
  got = loading.initial_params(config)
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
  kernel = got["layers"]["block_0"]["mlp"]["down"][layers.TRANSPOSED]
  assert kernel.shape == (LAYERS, E, F)  # [layers, out, in]


def test_config_mismatch_names_the_key(gemma_file):
  config = _config("gemma3")
  config.model.mlp_dim = 128
  with pytest.raises(gguf_files.CheckpointFileError, match="mlp_dim"):
    gguf_tensors.gguf_params(gemma_file, config.model, "gemma3_gguf")


def test_rope_scaling_must_match_the_config(tmp_path):
  path = _write(
      tmp_path / "scaled.gguf", "gemma3", _tensors("gemma3"), rope_scale=8.0
  )
  config = _config("gemma3")
  with pytest.raises(gguf_files.CheckpointFileError, match="rope_global_scale"):
    gguf_tensors.gguf_params(path, config.model, "gemma3_gguf")
  config.model.rope_global_scale = 8.0
  gguf_tensors.gguf_params(path, config.model, "gemma3_gguf")


def test_wrong_architecture_is_an_error(qwen_file):
  with pytest.raises(gguf_files.CheckpointFileError, match="qwen2"):
    gguf_tensors.gguf_params(qwen_file, _config("qwen2").model, "gemma3_gguf")


def test_missing_file_names_the_path(tmp_path):
  config = _config("gemma3")
  config.checkpoint.path = str(tmp_path / "nowhere.gguf")
  with pytest.raises(gguf_files.CheckpointFileError) as e:
    loading.initial_params(config)
  assert str(tmp_path / "nowhere.gguf") in str(e.value)
  assert "does not exist" in str(e.value)


def test_wrong_magic_names_the_path(tmp_path):
  path = tmp_path / "model.gguf"
  path.write_bytes(b"PK\x03\x04" + b"\0" * 64)
  config = _config("gemma3")
  config.checkpoint.path = str(path)
  with pytest.raises(gguf_files.CheckpointFileError) as e:
    loading.initial_params(config)
  assert str(path) in str(e.value) and "not a GGUF file" in str(e.value)


@pytest.mark.parametrize("keep", [0.3, 0.97])
def test_truncated_file_names_the_path(gemma_file, tmp_path, keep):
  data = open(gemma_file, "rb").read()
  path = tmp_path / "cut.gguf"
  path.write_bytes(data[: int(len(data) * keep)])
  with pytest.raises(gguf_files.CheckpointFileError) as e:
    gguf_files.open_gguf(str(path))
  assert str(path) in str(e.value)
  assert "truncated" in str(e.value)


def test_scratch_has_no_file():
  with pytest.raises(ValueError, match="scratch"):
    gguf_files.find_checkpoint_file(config_lib.base_config())


def test_explicit_path_wins(gemma_file):
  config = _config("gemma3")
  config.checkpoint.path = gemma_file
  assert gguf_files.find_checkpoint_file(config) == gemma_file
  assert os.path.isfile(gguf_files.find_checkpoint_file(config))
