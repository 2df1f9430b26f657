"""Tests for the BFCL wheel reader and the AST-style call checker."""

import json
import os
import zipfile

import pytest

from spade.eval import bfcl

_FUNCS = [
    {
        "name": "area",
        "parameters": {
            "type": "dict",
            "properties": {
                "base": {"type": "integer"},
                "height": {"type": "float"},
                "unit": {"type": "string"},
                "tags": {"type": "array"},
                "box": {"type": "dict"},
            },
        },
    },
    {"name": "other", "parameters": {"type": "dict", "properties": {}}},
]
_TRUTH = [
    {
        "area": {
            "base": [10],
            "height": [5.0],
            "unit": ["square meters", ""],
            "tags": [["a", "b"], ""],
            "box": [{"w": [1], "h": [2, ""]}, ""],
        }
    }
]


@pytest.mark.parametrize(
    "args",
    [
        {"base": 10, "height": 5.0},
        {"base": 10, "height": 5},  # an int is fine for a float
        {"base": 10, "height": 5.0, "unit": "Square-Meters"},
        {"base": 10, "height": 5.0, "tags": ["A", "b"]},
        {"base": 10, "height": 5.0, "box": {"w": 1}},
        {"base": 10, "height": 5.0, "box": {"w": 1, "h": 2}},
    ],
)
def test_accepts_correct_calls(args):
  assert bfcl.check_calls(_FUNCS, [("area", args)], _TRUTH) == (True, "ok")


@pytest.mark.parametrize(
    "calls,reason",
    [
        ([], "made 0 calls, expected 1"),
        ([("other", {})], "called 'other', expected 'area'"),
        ([("area", {"height": 5.0})], "missing parameter 'base'"),
        ([("area", {"base": 10, "height": 5, "x": 1})], "unexpected parameter"),
        ([("area", {"base": 10.0, "height": 5})], "base=10.0 not in"),
        ([("area", {"base": True, "height": 5})], "base=True not in"),
        ([("area", {"base": 10, "height": 6})], "height=6 not in"),
        ([("area", {"base": 10, "height": 5, "unit": "feet"})], "unit="),
        ([("area", {"base": 10, "height": 5, "tags": ["a"]})], "tags="),
        ([("area", {"base": 10, "height": 5, "box": {"h": 2}})], "box="),
        (
            [("area", {"base": 10, "height": 5, "box": {"w": 1, "z": 0}})],
            "box=",
        ),
        ([("area", {"base": 10, "height": 5})] * 2, "made 2 calls"),
    ],
)
def test_rejects_wrong_calls(calls, reason):
  ok, why = bfcl.check_calls(_FUNCS, calls, _TRUTH)
  assert not ok
  assert why.startswith(reason), why


def _fake_wheel(directory):
  path = os.path.join(
      directory, f"bfcl_eval-{bfcl.BFCL_VERSION}-py3-none-any.whl"
  )
  question = {"id": "simple_python_0", "question": [[]], "function": _FUNCS}
  answer = {"id": "simple_python_0", "ground_truth": _TRUTH}
  with zipfile.ZipFile(path, "w") as z:
    z.writestr(
        "bfcl_eval/data/BFCL_v4_simple_python.json", json.dumps(question) + "\n"
    )
    z.writestr(
        "bfcl_eval/data/possible_answer/BFCL_v4_simple_python.json",
        json.dumps(answer) + "\n",
    )
  return path


def test_reads_data_from_a_cached_wheel(tmp_path):
  path = _fake_wheel(str(tmp_path))
  assert bfcl.fetch_wheel(str(tmp_path), download=False) == path
  (entry,) = bfcl.load_category(path, "simple_python")
  assert entry["id"] == "simple_python_0"
  assert entry["ground_truth"] == _TRUTH
  with pytest.raises(bfcl.BfclUnavailable, match="no category 'nope'"):
    bfcl.load_category(path, "nope")


def test_missing_wheel_without_download_is_a_clear_error(tmp_path):
  with pytest.raises(bfcl.BfclUnavailable, match="downloading is disabled"):
    bfcl.fetch_wheel(str(tmp_path), download=False)
