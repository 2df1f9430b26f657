"""Every script under benchmarks/ and experiments/ starts: `--help` parses
its flags and imports everything it needs, so a flag clash or a stale import
fails here instead of an hour into a measurement."""

import pathlib
import subprocess
import sys

import pytest

_ROOT = pathlib.Path(__file__).resolve().parent.parent
_SCRIPTS = sorted(
    str(p.relative_to(_ROOT))
    for folder in ("benchmarks", "experiments")
    for p in (_ROOT / folder).glob("*.py")
)


def test_the_scripts_are_found():
  assert "benchmarks/rollout.py" in _SCRIPTS
  assert "experiments/learning_table.py" in _SCRIPTS


@pytest.mark.parametrize("script", _SCRIPTS)
def test_script_answers_help(script):
  run = subprocess.run(
      [sys.executable, script, "--help"],
      cwd=_ROOT,
      capture_output=True,
      text=True,
      timeout=300,
      env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"},
  )
  if "Try --helpfull" in run.stdout:
    return  # absl's app.run: --help lists the flags and exits with 1
  assert run.returncode == 0, run.stderr[-2000:]
  assert run.stdout.startswith("usage:"), run.stdout[:500]
