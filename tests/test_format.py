"""The tree is formatted in Google style (pyink, 2-space indent, 80 cols)."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_pyink_check():
  proc = subprocess.run(
      [sys.executable, "-m", "pyink", "--check", "--quiet", "."],
      cwd=ROOT,
      capture_output=True,
      text=True,
      check=False,
  )
  assert proc.returncode == 0, (
      "pyink would reformat these files (run `.venv/bin/pyink .`):\n"
      + proc.stderr
  )
