"""The orphan sweep: what pools of dead trainers left behind, removed.

Each pool's state directory (`DIR_PREFIX` under the temporary directory)
names its owner process in `OWNER_FILE`, and each sandbox's directory in it
names its host process in `HOST_FILE` (pid and start time, so a reused pid
does not count as alive). `sweep_orphans` removes the directories whose
owner is gone, with their sandboxes.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import shutil
import tempfile

from spade.sandbox import runsc

DIR_PREFIX = "spade-sandbox-"
OWNER_FILE = "owner.json"
HOST_FILE = "host.json"  # in each sandbox's directory: its host process

_log = logging.getLogger(__name__)


def write_owner(path: str, pid: int) -> None:
  """Records a process (pid and start time) as the owner of a directory."""
  with open(path, "w") as f:
    json.dump({"pid": pid, "start": runsc.start_time(pid)}, f)


def _read_owner(path: str) -> tuple[int, str | None] | None:
  try:
    with open(path) as f:
      owner = json.load(f)
    return int(owner["pid"]), owner.get("start")
  except (OSError, ValueError, KeyError, TypeError):
    return None


def sweep_orphans(
    tmp_root: str | None = None, runsc_path: str | None = None
) -> dict[str, int]:
  """Removes the sandboxes and state directories of pools whose owner died.

  A trainer killed with SIGKILL never closes its pool. Each pool's directory
  names its owner (pid and start time, so a reused pid does not count as
  alive); for every directory whose owner is gone this kills the host
  processes of its sandboxes (recorded per sandbox, and any process whose
  command line names the directory: runsc's sandbox and gofer, a bwrap or
  plain worker), deletes its gVisor containers (`runsc delete -force`:
  state and cgroups) and removes the directory. Directories of live owners,
  or without an owner file, are left alone.

  Returns:
    {"sandboxes", "processes", "directories"}: how many were removed.
  """
  root = tmp_root or tempfile.gettempdir()
  removed = {"sandboxes": 0, "processes": 0, "directories": 0}
  try:
    names = sorted(n for n in os.listdir(root) if n.startswith(DIR_PREFIX))
  except OSError:
    return removed
  binary = None
  for name in names:
    path = os.path.join(root, name)
    owner = _read_owner(os.path.join(path, OWNER_FILE))
    if owner is None or runsc.is_running(*owner):
      continue
    pids = set(runsc.processes_naming(path))
    for sb_dir in glob.glob(os.path.join(path, "sb*")):
      host = _read_owner(os.path.join(sb_dir, HOST_FILE))
      if host is not None and runsc.is_running(*host):
        pids.add(host[0])
      removed["sandboxes"] += 1
    for pid in pids:
      try:
        os.kill(pid, 9)
        removed["processes"] += 1
      except OSError:
        pass
    state_root = os.path.join(path, "runsc-state")
    ids = runsc.leftover_ids(state_root)
    if ids:
      binary = binary or runsc.find_runsc(runsc_path)
      if binary is None:
        _log.warning("cannot delete %s's containers: no runsc", path)
        continue
      for cid in ids:
        runsc.destroy(binary, state_root, cid, 0)
    shutil.rmtree(path, ignore_errors=True)
    removed["directories"] += 1
  if removed["directories"]:
    _log.info(
        "removed %d sandboxes (%d host processes) and %d state directories"
        " left by dead trainers",
        removed["sandboxes"],
        removed["processes"],
        removed["directories"],
    )
  return removed
