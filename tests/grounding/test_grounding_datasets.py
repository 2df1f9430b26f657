"""Grounding from TFDS datasets and seqio tasks, built tiny and local here.

These import TensorFlow (tens of seconds), so they are `slow`. They need the
`[data]` extra, which the test setup (`launch/setup.sh dev`) installs.
"""

import sys
import textwrap

import pytest

from spade import config as config_lib
from spade.grounding import build_corpus
from spade.grounding import SourceError

pytestmark = pytest.mark.slow

_TEXTS = [f"Document {i}: the tide turns twice a day." for i in range(7)]


def _config(**overrides):
  c = config_lib.base_config().grounding
  for k, v in overrides.items():
    c[k] = v
  return c


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
  """A prepared three-field TFDS dataset `spade_tiny_docs` in a temp dir."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  data_dir = str(tmp_path_factory.mktemp("tfds"))
  ds = tf.data.Dataset.from_tensor_slices(
      {
          "text": _TEXTS,
          "title": [f"Title {i}" for i in range(len(_TEXTS))],
      }
  )
  builder = tfds.dataset_builders.TfDataBuilder(
      name="spade_tiny_docs",
      config="default",
      version="1.0.0",
      split_datasets={"train": ds},
      features=tfds.features.FeaturesDict(
          {"text": tfds.features.Text(), "title": tfds.features.Text()}
      ),
      data_dir=data_dir,
  )
  builder.download_and_prepare()
  return data_dir


def test_tfds_source_reads_even_shards(tfds_dir):
  cfg = _config(source="tfds", name="spade_tiny_docs", path=tfds_dir)
  shards = [
      build_corpus(cfg, process_index=i, process_count=2) for i in range(2)
  ]
  texts = [[d.text for d in s.documents] for s in shards]
  assert [len(t) for t in texts] == [4, 3]
  assert sorted(texts[0] + texts[1]) == sorted(_TEXTS)
  doc = shards[1].documents[0]
  assert doc.source == "tfds" and doc.id == "spade_tiny_docs/train/1/0"
  assert doc.title == "Title " + doc.text.split(":")[0].split()[-1]
  assert len(shards[0].sample(5)) == 5


def test_tfds_missing_dataset_and_split_are_named(tfds_dir):
  with pytest.raises(SourceError, match="'no_such_docs' not found"):
    build_corpus(_config(source="tfds", name="no_such_docs", path=tfds_dir))
  with pytest.raises(SourceError, match="has no split 'validation'"):
    build_corpus(
        _config(
            source="tfds",
            name="spade_tiny_docs",
            path=tfds_dir,
            split="validation",
        )
    )


def test_seqio_source_registers_the_task_by_module(tmp_path, monkeypatch):
  (tmp_path / "spade_tiny_seqio.py").write_text(textwrap.dedent(f"""
      import seqio
      import tensorflow as tf

      def _fn(split, shuffle_files, seed=None):
        return tf.data.Dataset.from_tensor_slices({{"text": {_TEXTS!r}}})

      seqio.TaskRegistry.add(
          "spade_tiny_task",
          source=seqio.FunctionDataSource(_fn, splits=["train"]),
          output_features={{}},
      )
  """))
  monkeypatch.syspath_prepend(str(tmp_path))
  cfg = _config(
      source="seqio", name="spade_tiny_task", module="spade_tiny_seqio"
  )
  shards = [
      build_corpus(cfg, process_index=i, process_count=3) for i in range(3)
  ]
  texts = [[d.text for d in s.documents] for s in shards]
  assert texts[0] == [_TEXTS[0], _TEXTS[3], _TEXTS[6]]
  assert texts[1] == [_TEXTS[1], _TEXTS[4]]
  assert texts[2] == [_TEXTS[2], _TEXTS[5]]
  assert shards[2].documents[1].id == "spade_tiny_task/train/2/1"
  sys.modules.pop("spade_tiny_seqio", None)


def test_seqio_unregistered_task_is_a_clear_error():
  with pytest.raises(SourceError, match="'no_such_task' is not registered"):
    build_corpus(_config(source="seqio", name="no_such_task"))
