"""Grounding: the local sources, cleaning, truncation, cursor and shards."""

import gzip
import json

import pytest

from spade import config as config_lib
from spade.grounding import build_corpus
from spade.grounding import clean_text
from spade.grounding import Corpus
from spade.grounding import Document
from spade.grounding import SourceError
from spade.grounding import truncate_words
from spade.grounding import builtin


def _config(**overrides):
  c = config_lib.base_config().grounding
  for k, v in overrides.items():
    c[k] = v
  return c


def test_clean_text_normalises_layout_and_drops_control_chars():
  raw = "  Title\r\n\r\n\r\n\r\nBody\x00 text\x07\tend   \r\nCafe\u0301\ufeff  "
  assert clean_text(raw) == "Title\n\nBody text    end\nCaf\u00e9"


def test_truncate_words_keeps_layout_and_marks_the_cut():
  text = "one two\nthree  four\n\nfive six"
  assert truncate_words(text, 4) == (
      "one two\nthree  four\n[Document truncated at 4 words]"
  )
  assert truncate_words(text, 6) == text
  assert truncate_words(text, 0) == text


def test_reference_text_rule_is_the_references_truncate():
  # spade/core/corpus.py, Corpus._truncate: stripped; over budget, the
  # words joined by single spaces and a "~N words" note.
  from spade.grounding import corpus as corpus_lib  # pylint: disable=g-import-not-at-top

  text = "  one two\nthree  four\n\nfive six  "
  assert corpus_lib.reference_text(text, 4) == (
      "one two three four\n[Document truncated at ~4 words]"
  )
  assert corpus_lib.reference_text(text, 6) == text.strip()
  doc = corpus_lib.Document(id="d", title="t", text=text, source="jsonl")
  (ref,) = corpus_lib.prepare([doc], 4)
  (ours,) = corpus_lib.prepare([doc], 4, "layout")
  assert ref.text.endswith("~4 words]") and "\n" not in ref.text.split("\n[")[0]
  assert ours.text == truncate_words(text.strip(), 4)


def test_builtin_corpus_is_pythons_documentation():
  docs = builtin.documents()
  ids = [d.id for d in docs]
  assert len(docs) > 100
  assert "python-docs:topic/for" in ids
  assert "python-docs:module/heapq" in ids
  heapq = docs[ids.index("python-docs:module/heapq")]
  assert "heap" in heapq.text.lower() and "function heappush" in heapq.text
  assert all(d.source == "builtin" and len(d.text.split()) >= 40 for d in docs)


def test_build_corpus_builtin_truncates_to_max_words():
  corpus = build_corpus(_config(source="builtin", max_words=50))
  docs = corpus.sample(20)
  assert len(docs) == 20 and len({d.id for d in docs}) == 20
  for d in docs:
    body = d.text.split("\n[Document truncated")[0]
    assert len(body.split()) <= 50


def test_jsonl_source_reads_text_and_reference_orig_doc(tmp_path):
  path = tmp_path / "corpus.jsonl"
  lines = [
      {"text": "A sorting network compares and swaps pairs.", "title": "S"},
      {"orig_doc": "Rivers carry sediment to the sea."},
      {"text": "Chess openings trade tempo for structure.", "id": "chess"},
  ]
  path.write_text("\n".join(json.dumps(l) for l in lines) + "\n\n")
  corpus = build_corpus(_config(source="jsonl", path=str(path)))
  by_id = {d.id: d for d in corpus.documents}
  assert sorted(by_id) == ["chess", "corpus.jsonl:1", "corpus.jsonl:2"]
  assert by_id["corpus.jsonl:1"].title == "S"
  assert by_id["corpus.jsonl:2"].text == "Rivers carry sediment to the sea."
  assert all(d.source == "jsonl" for d in corpus.documents)


def test_jsonl_directory_and_gzip(tmp_path):
  (tmp_path / "a.jsonl").write_text(json.dumps({"text": "first doc"}) + "\n")
  with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:
    f.write(json.dumps({"text": "second doc"}) + "\n")
  (tmp_path / "settings.json").write_text('{"not": "a corpus"}')
  corpus = build_corpus(_config(source="jsonl", path=str(tmp_path)))
  assert [d.text for d in corpus.documents] == ["first doc", "second doc"]


def test_jsonl_errors_name_the_file_and_line(tmp_path):
  with pytest.raises(SourceError, match="missing.jsonl.*does not exist"):
    build_corpus(_config(source="jsonl", path=str(tmp_path / "missing.jsonl")))
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"text": "ok"}\n{not json\n')
  with pytest.raises(SourceError, match=r"bad.jsonl:2 is not valid JSON"):
    build_corpus(_config(source="jsonl", path=str(bad)))
  nokey = tmp_path / "nokey.jsonl"
  nokey.write_text('{"body": "x"}\n')
  with pytest.raises(SourceError, match=r"nokey.jsonl:1 has no 'text'"):
    build_corpus(_config(source="jsonl", path=str(nokey)))
  with pytest.raises(SourceError, match="grounding.path is empty"):
    build_corpus(_config(source="jsonl", path=""))


def test_text_source_reads_txt_and_md_recursively(tmp_path):
  (tmp_path / "sub").mkdir()
  (tmp_path / "a.md").write_text("# Tides\n\nThe moon pulls the oceans.\n")
  (tmp_path / "sub" / "b.txt").write_text("Bees dance to share directions.")
  (tmp_path / "ignored.json").write_text("{}")
  corpus = build_corpus(_config(source="text", path=str(tmp_path)))
  docs = corpus.documents
  assert [d.id for d in docs] == ["a.md", "sub/b.txt"]
  assert docs[0].title == "Tides"
  assert docs[1].text == "Bees dance to share directions."
  with pytest.raises(SourceError, match="x\\*.md' matches no file"):
    build_corpus(_config(source="text", path=str(tmp_path / "sub" / "x*.md")))
  (tmp_path / "empty").mkdir()
  with pytest.raises(SourceError, match="holds no file ending in"):
    build_corpus(_config(source="text", path=str(tmp_path / "empty")))


def _docs(n):
  return [
      Document(id=f"d{i}", title="", text=f"text {i}", source="jsonl")
      for i in range(n)
  ]


def test_sampling_visits_every_document_once_per_epoch():
  corpus = Corpus(_docs(7), source="jsonl", seed=3)
  first = [d.id for d in corpus.sample(7)]
  second = [d.id for d in corpus.sample(7)]
  assert sorted(first) == sorted(second) == [f"d{i}" for i in range(7)]
  assert first != second  # each epoch has its own order
  again = Corpus(_docs(7), source="jsonl", seed=3)
  assert [d.id for d in again.sample(14)] == first + second
  other = Corpus(_docs(7), source="jsonl", seed=4)
  assert [d.id for d in other.sample(7)] != first


def test_cursor_resumes_exactly():
  corpus = Corpus(_docs(5), source="jsonl", seed=1)
  corpus.sample(3)
  state = json.loads(json.dumps(corpus.state()))
  assert state == {"version": 1, "source": "jsonl", "seed": 1, "drawn": 3}
  expected = [d.id for d in corpus.sample(9)]
  resumed = Corpus(_docs(5), source="jsonl", seed=1)
  resumed.restore(state)
  assert [d.id for d in resumed.sample(9)] == expected
  assert resumed.state()["drawn"] == 12
  with pytest.raises(ValueError, match="same source"):
    Corpus(_docs(5), source="text").restore(state)


def test_processes_read_disjoint_shards_with_a_shared_cursor(tmp_path):
  path = tmp_path / "c.jsonl"
  path.write_text(
      "\n".join(json.dumps({"text": f"document {i}"}) for i in range(10))
  )
  cfg = _config(source="jsonl", path=str(path))
  shards = [
      build_corpus(cfg, process_index=i, process_count=3) for i in range(3)
  ]
  ids = [{d.id for d in s.documents} for s in shards]
  assert [len(s) for s in ids] == [4, 3, 3]
  assert set.union(*ids) == {f"c.jsonl:{i}" for i in range(1, 11)}
  assert not ids[0] & ids[1] and not ids[1] & ids[2]
  for s in shards:
    s.sample(2)
  assert len({json.dumps(s.state()) for s in shards}) == 1
  with pytest.raises(ValueError, match="process_index=3"):
    build_corpus(cfg, process_index=3, process_count=3)


def test_disabled_grounding_yields_nothing():
  corpus = build_corpus(_config(enabled=False, source="jsonl", path=""))
  assert corpus.sample(4) == []
  assert corpus.state()["drawn"] == 0
