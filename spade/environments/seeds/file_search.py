"""Seed environment (tool use): find a setting in a small file system."""

import json
import random


def _call(name, **arguments):
  return (
      "<tool_call>"
      + json.dumps({"name": name, "arguments": arguments})
      + "</tool_call>"
  )


_KEYS = ["timeout", "retries", "port", "workers", "cache_mb", "batch"]


class FileSearchEnv(ToolUseBaseEnv):
  """A file-system assistant must find which config file sets a key.

  Directories hold config files of key=value lines; exactly one file sets
  the asked key. List directories and read files, then answer its value.
  """

  def __init__(self, max_turns=12, **kwargs):
    super().__init__(max_turns=max_turns, **kwargs)

  def reset(self, seed=None):
    rng = random.Random(seed)
    self.turn_count = 0
    self._call_history = []
    key = rng.choice(_KEYS)
    others = [k for k in _KEYS if k != key]
    dirs = ["/etc/app", "/etc/app/conf.d", "/srv/app"]
    files = {}
    for d in dirs:
      for n in rng.sample(["base", "local", "prod", "extra", "net"], 2):
        path = f"{d}/{n}.cfg"
        files[path] = {k: rng.randint(1, 999) for k in rng.sample(others, 3)}
    self._path = rng.choice(sorted(files))
    files[self._path][key] = rng.randint(1000, 9999)
    self._key = key
    self._state = {"dirs": dirs, "files": files}
    self._expected_answer = str(files[self._path][key])
    self._tools = {
        "ls": {
            "description": "List the files and subdirectories of a directory",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
        "cat": {
            "description": "Print a file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
    return (
        f"TASK: Exactly one config file under /etc/app or /srv/app sets"
        f" '{key}'. Find it and answer its value: <answer>N</answer>.",
        {},
    )

  def tool_ls(self, path=""):
    path = str(path).rstrip("/")
    entries = [
        p[len(path) + 1 :]
        for p in list(self._state["files"]) + self._state["dirs"]
        if p.startswith(path + "/") and "/" not in p[len(path) + 1 :]
    ]
    if not entries:
      return f"Error: {path!r} is not a directory with entries"
    return json.dumps(sorted(entries))

  def tool_cat(self, path=""):
    f = self._state["files"].get(str(path))
    if f is None:
      return f"Error: no file {path!r}"
    return "\n".join(f"{k}={v}" for k, v in f.items())

  def hint(self):
    return f"The file is in {self._path.rsplit('/', 1)[0]}."

  def solution(self):
    d = self._path.rsplit("/", 1)[0]
    return [
        _call("ls", path=d),
        _call("cat", path=self._path),
        f"<answer>{self._expected_answer}</answer>",
    ]
