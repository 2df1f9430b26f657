"""BFCL v4 function-calling data, read from the `bfcl-eval` wheel, and a checker.

The `bfcl-eval` wheel ships the Berkeley Function Calling Leaderboard v4 data,
but installing it pulls ~6.4 GB (CUDA torch) and pins numpy 1.26, so SPADE
never installs it: `fetch_wheel` runs `pip download --no-deps` into a cache
directory and `load_category` reads only the JSON-lines data files from the
zip.

`check_calls` is SPADE's own AST-style checker, following BFCL's rules for
the single-turn categories: the model must make exactly as many calls as the
ground truth (one, for `simple_python` and `multiple`), with the right
function name, no unknown parameters, every required parameter present, and
each value equal to one of the possible answers (strings compared after
BFCL's standardisation: case, spaces and `,./-_*^` ignored; an integer is
accepted where a float is expected; "" among the possible answers marks an
optional parameter).
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import zipfile
from typing import Any

BFCL_VERSION = "2026.3.23"
_DATA_PREFIX = "bfcl_eval/data/"


class BfclUnavailable(RuntimeError):
  """The BFCL wheel could not be found or downloaded; the message says why."""


def default_cache_dir() -> str:
  """~/.cache/spade/bfcl."""
  return os.path.join(os.path.expanduser("~"), ".cache", "spade", "bfcl")


def fetch_wheel(
    cache_dir: str, *, download: bool = True, timeout_s: float = 300.0
) -> str:
  """Path to the `bfcl-eval` wheel in `cache_dir`, downloading it if needed.

  Args:
    cache_dir: where the wheel is kept between runs.
    download: when False, only a wheel already in the cache is used.
    timeout_s: limit for `pip download`.

  Raises:
    BfclUnavailable: no wheel in the cache and it could not be downloaded.
  """
  pattern = os.path.join(cache_dir, f"bfcl_eval-{BFCL_VERSION}-*.whl")
  found = sorted(glob.glob(pattern))
  if found:
    return found[-1]
  if not download:
    raise BfclUnavailable(f"no {pattern} and downloading is disabled")
  os.makedirs(cache_dir, exist_ok=True)
  cmd = [
      sys.executable,
      "-m",
      "pip",
      "download",
      "--no-deps",
      "--quiet",
      f"bfcl-eval=={BFCL_VERSION}",
      "-d",
      cache_dir,
  ]
  try:
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout_s, check=False
    )
  except (OSError, subprocess.TimeoutExpired) as e:
    raise BfclUnavailable(f"`{' '.join(cmd[2:])}` failed: {e}") from e
  found = sorted(glob.glob(pattern))
  if proc.returncode != 0 or not found:
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
    raise BfclUnavailable(
        f"`{' '.join(cmd[2:])}` exited {proc.returncode}: {tail[0]}"
    )
  return found[-1]


def load_category(wheel: str, category: str) -> list[dict]:
  """The entries of one BFCL v4 category, each with its `ground_truth`.

  Args:
    wheel: path from `fetch_wheel`.
    category: a file stem such as "simple_python" or "multiple".

  Returns:
    Dicts with "id", "question" (list of turns of chat messages), "function"
    (JSON schemas) and "ground_truth" (list of {name: {param: [options]}}).
  """
  name = f"{_DATA_PREFIX}BFCL_v4_{category}.json"
  answer_name = f"{_DATA_PREFIX}possible_answer/BFCL_v4_{category}.json"
  try:
    with zipfile.ZipFile(wheel) as z:
      questions = _json_lines(z.read(name))
      truths = {
          e["id"]: e["ground_truth"] for e in _json_lines(z.read(answer_name))
      }
  except KeyError as e:
    raise BfclUnavailable(
        f"{os.path.basename(wheel)} has no category {category!r}; fix"
        " config.eval.bfcl_categories (e.g. simple_python, multiple)"
    ) from e
  except (zipfile.BadZipFile, OSError) as e:
    raise BfclUnavailable(f"cannot read {wheel}: {e}; delete it") from e
  for entry in questions:
    entry["ground_truth"] = truths[entry["id"]]
  return questions


def _json_lines(data: bytes) -> list[dict]:
  return [json.loads(line) for line in data.decode().splitlines() if line]


def standardize(text: str) -> str:
  """BFCL's string normalisation: drop spaces and `,./-_*^`, lowercase."""
  return re.sub(r"[ ,./\-_*^]", "", text).lower().replace("'", '"')


def check_calls(
    functions: list[dict],
    calls: list[tuple[str, dict]],
    ground_truth: list[dict],
) -> tuple[bool, str]:
  """Checks the model's calls against BFCL's possible answers.

  Args:
    functions: the function schemas offered to the model.
    calls: (name, arguments) parsed from the reply, in order.
    ground_truth: BFCL's list of {function name: {param: [options]}}.

  Returns:
    (correct, reason): reason is "ok" or what was wrong first.
  """
  if len(calls) != len(ground_truth):
    return False, f"made {len(calls)} calls, expected {len(ground_truth)}"
  for (name, args), truth in zip(calls, ground_truth):
    ok, reason = _check_one(functions, name, args, truth)
    if not ok:
      return False, reason
  return True, "ok"


def _check_one(functions, name, args, truth) -> tuple[bool, str]:
  """One call against one ground-truth entry {name: {param: [options]}}."""
  expected_name = next(iter(truth))
  if name != expected_name:
    return False, f"called {name!r}, expected {expected_name!r}"
  options_by_param = truth[expected_name]
  schema = next((f for f in functions if f.get("name") == name), {})
  properties = schema.get("parameters", {}).get("properties", {})
  for param in args:
    if param not in options_by_param:
      return False, f"unexpected parameter {param!r}"
  for param, options in options_by_param.items():
    if param not in args:
      if "" in options:
        continue
      return False, f"missing parameter {param!r}"
    declared = properties.get(param, {}).get("type")
    if not any(_matches(args[param], o, declared) for o in options if o != ""):
      return False, f"{param}={args[param]!r} not in {options!r}"
  return True, "ok"


def _matches(value: Any, option: Any, declared: str | None = None) -> bool:
  """Whether one argument value equals one possible answer, BFCL-style."""
  if declared == "integer" and (
      isinstance(value, bool) or not isinstance(value, int)
  ):
    return False
  if isinstance(option, bool) or isinstance(value, bool):
    return isinstance(option, bool) and value is option
  if isinstance(option, (int, float)):
    # An integer is accepted for a float, as BFCL's Python checker does.
    return isinstance(value, (int, float)) and float(value) == float(option)
  if isinstance(option, str):
    return isinstance(value, str) and standardize(value) == standardize(option)
  if isinstance(option, list):
    return (
        isinstance(value, (list, tuple))
        and len(value) == len(option)
        and all(_matches(v, o) for v, o in zip(value, option))
    )
  if isinstance(option, dict):
    if not isinstance(value, dict):
      return False
    for key in value:
      if key not in option:
        return False
    for key, sub in option.items():
      # Nested dict answers hold lists of options per key, "" when optional.
      subs = sub if isinstance(sub, list) else [sub]
      if key not in value:
        if "" in subs:
          continue
        return False
      if not any(_matches(value[key], s) for s in subs if s != ""):
        return False
    return True
  return value == option
