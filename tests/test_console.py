"""The console: live lines with rates, named first compilations, quiet."""

import os

from spade import console


def test_ticker_lines_say_rate_rows_and_eta(capsys, monkeypatch):
  clock = iter([0.0, 2.0, 20.0, 21.0, 40.0])
  monkeypatch.setattr(console.time, "perf_counter", lambda: next(clock))
  t = console.Ticker("designer sampling", total=1000, every=10.0)
  t.update(100, live=4, rows=4)  # 2 s in: under `every`, no line
  t.update(400, live=2, rows=4)  # 20 s: a line
  t.update(500, live=2, rows=4)  # 21 s: too soon again
  t.close(800)
  err = capsys.readouterr().err.splitlines()
  assert err == [
      "spade: designer sampling: 400/1,000 tok, 20.0 tok/s, 2/4 rows live,"
      " ETA 30s",
      "spade: designer sampling: 800 tok in 40.0s (20.0 tok/s)",
  ]


def test_a_short_quiet_step_prints_nothing(capsys):
  console.Ticker("hint writer").close(10)
  assert capsys.readouterr().err == ""


def test_first_compile_is_named_once_per_shape(capsys):
  assert console.first_compile("the test sampler", (2, 4096))
  assert not console.first_compile("the test sampler", (2, 4096))
  assert console.first_compile("the test sampler", (4, 4096))
  err = capsys.readouterr().err.splitlines()
  assert err == [
      "spade: compiling the test sampler for 2 x 4096, once per shape",
      "spade: compiling the test sampler for 4 x 4096, once per shape",
  ]


def test_no_tpu_probe_on_a_host_without_tpus(monkeypatch):
  monkeypatch.delenv("JAX_PLATFORMS", raising=False)
  monkeypatch.setattr(console, "_has_tpu_devices", lambda: False)
  console.no_tpu_probe()
  assert os.environ["JAX_PLATFORMS"] == "cpu"
  monkeypatch.setenv("JAX_PLATFORMS", "tpu")  # a user's choice is kept
  console.no_tpu_probe()
  assert os.environ["JAX_PLATFORMS"] == "tpu"


def test_muted_prints_nothing_and_ends(capsys):
  with console.muted():
    assert console.is_muted()
    console.say("inside")
    console.refresh("inside too")
  assert not console.is_muted()
  console.say("after")
  assert capsys.readouterr().err.splitlines() == ["spade: after"]
