"""The run's summary: design rows, summary.md, plots, the footer."""

import json
import os

import numpy as np
import pytest

from spade.designer import examples
from spade.selfplay import records
from spade.selfplay import report


def _design(index, code, verdict):
  return records.Design(
      index=index,
      group=0,
      prompt_ids=(1,),
      completion_ids=(2,),
      logprobs=(0.0,),
      code=code,
      verdict=verdict,
  )


def test_design_rows_name_the_class_the_failure_and_a_near_copy():
  # The example with a renamed attribute: still a near-copy.
  copied = examples.BY_FAMILY["multi_turn_game"].replace(
      "self.turn_count", "self.turns_taken"
  )
  designs = [
      _design(0, copied, records.Verdict(
          True, "ok", details={"class_name": "TradingEnv"})),
      _design(1, "class X(:\n", records.Verdict(
          False, "syntax", "SyntaxError (line 1): invalid syntax\nmore")),
      _design(2, "class TinyEnv:\n  def reset(self, seed=None):\n"
              "    return 'hi', {}\n", records.Verdict(
                  True, "ok", details={"class_name": "TinyEnv"})),
  ]  # fmt: skip
  earned = {
      2: dict(return_nohint=0.25, return_hint=0.75, regret=0.5, reward=0.4,
              shows="Grid 3x3.\n| you at (0,0) | goal at (2,2) | " + "." * 80)
  }  # fmt: skip
  rows = report.design_rows(designs, threshold=0.85, earned=earned)
  assert [r["name"] for r in rows] == ["TradingEnv", "-", "TinyEnv"]
  assert [r["earned"] for r in rows] == [None, None, earned[2]]
  line = report.iteration_lines(1, rows, _metrics(1, 0.5))[3]
  assert line == (
      "  design 2: TinyEnv: valid; played: return 0.25 without hint, 0.75"
      " with, regret 0.500, designer reward 0.400; shows 'Grid 3x3. | you at"
      " (0,0) | goal at (2,2) | ...........................'"
  )
  table = report.iteration_markdown(1, rows, _metrics(1, 0.5), None)
  assert (
      "| 2 | `TinyEnv` | valid | - | 1 | 0.25 | 0.75 | 0.500 | 0.400 |"
      " Grid 3x3. \\| you at (0,0) \\| goal at (2,2) \\| ......" in table
  )
  assert "| 1 | `-` | syntax: SyntaxError" in table and (
      "| - | - | - | - | - |" in table
  )
  # The first observation is one line of at most 70 characters.
  assert len(report.shown_text(earned[2]["shows"])) == 70
  assert rows[0]["verdict"] == "valid"
  assert rows[0]["copy"] == "multi_turn_game"
  assert rows[1]["verdict"] == "syntax: SyntaxError (line 1): invalid syntax"
  assert rows[2]["copy"] is None


def _metrics(step, ret):
  return {
      "step": step,
      "agent/return_nohint": ret,
      "agent/return_hint": ret + 0.25,
      "regret/mean": 0.125,
      "designer/valid_rate": 0.5,
      "train/rows_with_signal": 3.0,
      "train/rows_total": 8.0,
      "time/iteration_s": 12.0,
  }


def test_lines_summary_md_and_plots(tmp_path):
  workdir = str(tmp_path)
  rows = [dict(index=0, name="AEnv", verdict="valid", copy=None, attempts=1)]
  lines = report.iteration_lines(1, rows, _metrics(1, 0.5))
  assert lines[0] == (
      "iteration 1: return 0.50 without hint, 0.75 with; regret 0.125;"
      " 3 of 8 rows with signal; 12s"
  )
  assert lines[1] == "  design 0: AEnv: valid"
  assert report.plots(workdir, [_metrics(1, 0.5)]) == []
  report.write_summary(
      workdir, 1, report.iteration_markdown(1, rows, _metrics(1, 0.5), None),
      title="run",
  )  # fmt: skip
  paths = report.plots(workdir, [_metrics(1, 0.5), _metrics(2, 0.25)])
  assert sorted(os.path.basename(p) for p in paths) == [
      "regret.png", "returns.png", "validity.png"
  ]  # fmt: skip
  from matplotlib import image  # pylint: disable=g-import-not-at-top

  pixels = image.imread(paths[0])
  assert pixels.shape[0] == 300 and pixels.shape[1] == 500
  assert np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0).shape[0] > 10
  text = report.write_summary(
      workdir, 2, report.iteration_markdown(2, [], _metrics(2, 0.25), "p/2"),
      title="run",
  )  # fmt: skip
  with open(text) as f:
    md = f.read()
  assert md.startswith("# run\n\n![validity](plots/validity.png)")
  assert md.index("## Iteration 1") < md.index("## Iteration 2")
  assert "| 0 | `AEnv` | valid | - | 1 |" in md
  assert "Programs, verdicts and transcripts: `p/2`" in md
  # A resumed run that redoes iteration 2 replaces its section.
  report.write_summary(
      workdir, 2, report.iteration_markdown(2, [], _metrics(2, 0.0), None),
      title="run",
  )  # fmt: skip
  with open(text) as f:
    assert f.read().count("## Iteration 2") == 1
  with open(report.write_html(workdir)) as f:
    page = f.read()
  assert page.count("<img ") == 3 and 'src="plots/returns.png"' in page
  assert page.count("<table>") == 3  # two iterations' returns, one designs
  assert "<td><code>AEnv</code></td><td>valid</td>" in page


def test_footer_names_the_files_and_commands():
  text = report.footer("runs/x", "runs/x/programs/iter_000001",
                       "runs/x/programs/iter_000001/design_000.py", True)  # fmt: skip
  assert "tensorboard --logdir runs/x" in text
  assert "python -m spade.memory.show runs/x" in text
  assert (
      "python -m spade.environments.play"
      " runs/x/programs/iter_000001/design_000.py --workdir runs/x"
      " --show-hint" in text
  )
  assert "plots in runs/x/plots/" in text


def test_a_played_design_shows_an_unhinted_first_observation():
  from types import SimpleNamespace  # pylint: disable=g-import-not-at-top

  from spade.selfplay import loop  # pylint: disable=g-import-not-at-top

  ok = records.Verdict(True, "ok", details={"class_name": "E"})
  designs = [_design(0, "x", ok), _design(1, "y", ok)]
  ep = lambda env, hinted, obs: SimpleNamespace(
      env_index=env, hinted=hinted, first_observation=obs
  )
  played = SimpleNamespace(
      designs=designs,
      top_ups=[],
      # The window's first environment is a seed program; 1 and 2 are the
      # designs 1 and 0.
      window=SimpleNamespace(envs=[
          SimpleNamespace(design_index=None),
          SimpleNamespace(design_index=1),
          SimpleNamespace(design_index=0),
      ]),
      scores=SimpleNamespace(
          arm_mean=lambda e, arm: 0.1 * e + arm, regret=[0.0, 0.5, 0.25]
      ),
      design_reward=lambda d: 0.3 + d.index,
      episodes=[
          ep(2, True, "hinted: go east"), ep(1, False, ""),
          ep(2, False, "go east"), ep(1, True, "hinted only"),
      ],
  )  # fmt: skip
  earned = loop._earned(played)  # pylint: disable=protected-access
  assert earned[0]["shows"] == "go east"
  # No unhinted play showed anything: the hinted one's first observation.
  assert earned[1]["shows"] == "hinted only"
  assert earned[0]["regret"] == 0.25 and earned[1]["reward"] == 1.3
  assert earned[0]["return_hint"] == pytest.approx(1.2)
