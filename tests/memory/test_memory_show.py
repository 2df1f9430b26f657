"""`python -m spade.memory.show`: the table, --top, --dump and errors."""

import json
import os
import subprocess
import sys

import pytest

from spade import config as config_lib
from spade.memory import Archive
from spade.memory import MEMORY_FILE
from spade.memory import show

import memory_programs as programs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  """A workdir whose memory.json holds three played games and a failure."""
  a = Archive(config_lib.base_config().memory)
  ids = [a.add(p, verdict={"valid": True}, iteration=i)[0]
         for i, p in enumerate(programs.ALL[:3])]  # fmt: skip
  a.add(
      programs.ARITH,
      verdict={"valid": False, "reason": "solution", "message": "no win"},
      iteration=3,
  )
  for env_id, regret in zip(ids, (0.25, 0.75, 0.5)):
    a.update_stats(
        env_id,
        iteration=4,
        regret=regret,
        win_rate_hint=0.875,
        win_rate_nohint=0.125,
        episodes=8,
    )
  path = tmp_path_factory.mktemp("run")
  (path / MEMORY_FILE).write_text(json.dumps(a.state_dict()))
  return str(path)


def test_table_lists_every_entry(workdir, capsys, monkeypatch):
  # The table fits the terminal; pin its width (CI's may be 80 columns).
  monkeypatch.setenv("COLUMNS", "120")
  assert show.main([workdir]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert lines[0].split()[:7] == [
      "id", "iter", "verdict", "regret", "win+h", "win-h", "plays",
  ]  # fmt: skip
  rows = [l for l in lines if l.startswith("env-")]
  assert [r.split()[0] for r in rows] == [f"env-00000{i}" for i in range(4)]
  assert rows[1].split()[1:7] == ["1", "ok", "0.75", "0.88", "0.12", "1"]
  assert "Move a stack of disks" in rows[1]
  assert rows[3].split()[1:4] == ["3", "solution", "-"]
  assert lines[-1] == (
      "4 environments, 3 valid, 0 duplicates rejected, 0 evicted"
  )


def test_top_sorts_by_regret(workdir, capsys):
  assert show.main([workdir, "--top", "2"]) == 0
  rows = [l for l in capsys.readouterr().out.splitlines() if l[:4] == "env-"]
  assert [r.split()[0] for r in rows] == ["env-000001", "env-000002"]


def test_dump_prints_the_code(workdir, capsys):
  assert show.main([workdir, "--dump", "env-000003"]) == 0
  out = capsys.readouterr().out
  assert out.startswith("# env-000003  iteration 3")
  assert "# verdict: solution: no win" in out
  assert programs.ARITH in out
  assert show.main([workdir, "--dump", "env-999"]) == 2
  assert "no entry 'env-999'" in capsys.readouterr().err


def test_missing_memory_file_is_a_clear_error(tmp_path, capsys):
  assert show.main([str(tmp_path)]) == 2
  assert "memory.json does not exist" in capsys.readouterr().err


def test_module_entry_point(workdir):
  proc = subprocess.run(
      [sys.executable, "-m", "spade.memory.show", workdir, "--top", "1"],
      cwd=ROOT,
      capture_output=True,
      text=True,
      check=False,
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.splitlines()[2].startswith("env-000001")
