"""RLVE's verifiable environments as a levelled family ("rlve").

The reference's RLVE baseline (`spade-rl/spade`
`spade/core/envs/rlve_adapter.py`, `cmd/games/train_fixed_rlve_*.sh`) plays
the 16 official environments of RLVE (PyPI `rlve-gym` 0.0.1, MIT), each
single-turn: a problem is generated, the agent answers once, RLVE's
verifier scores the answer. For (name, level, seed) this module does what
the adapter's `create_instances_same_problem` does for one group:

- a fresh `ParameterController` of the environment, `update()`d `level`
  times (level clamped to [0, 20]), gives the parameter list; one entry
  and a problem seed in [0, 2**31 - 1] are drawn, and `generator(seed,
  parameter)` is tried, up to 10 times until it succeeds;
- the problem text is `prompt_generator()`; the agent is asked for
  `\\boxed{}` with the suffix of `fixed_env_orchestrator._build_initial_prompt`
  ("rlve" category);
- a reply is scored as `RlveGymWrapper.step` does: the first
  `\\boxed{...}` (`extract_boxed_answer`) is appended as
  `<answer>...</answer>`, RLVE's `verifier` runs, and the reward is 1.0 when
  its `accuracy` is 1, else 0.0; the episode ends.

Generation runs on the host in a worker subprocess (`python -m
spade.environments.rlve --serve`): `rlve-gym` imports torch at import,
ShortestPath needs networkx, `generator()` reseeds the global `random`,
`numpy.random` and torch generators, and its timeout thread is never
stopped; none of that reaches the trainer's process. The emitted program is
self-contained and standard-library only, for the sandbox: rlve-gym's own
`VerifiableEnvironment` class and the environment's module, verbatim (their
imports of `Gym` and of packages outside the standard library removed),
the generated problem's config (`get_config()`: seed and the parameter dict
the scorer reads, answer included) as a Python literal, and an `*Env` class
that plays it.

Where this differs from the reference: the draws of the parameter entry and
the problem seed come from `random.Random(seed)` instead of the global
generator (which RLVE's own `generator()` reseeds from the previous problem),
so a (name, level, seed) always gives the same problem and a resumed run
plays what an uninterrupted one would.
"""

from __future__ import annotations

import ast
import atexit
import json
import os
import random
import subprocess
import sys
import threading
from typing import Any

from spade.environments import levels

# The 16 environments of `RLVE_ENV_SET=official16`
# (cmd/games/train_fixed_rlve_*.sh).
OFFICIAL = (
    "Division",
    "EuclidGame",
    "GCDOne_Counting",
    "HamiltonianPath",
    "LampChanging",
    "LargestConvexPolygon",
    "Multiplication",
    "PCPPermutation",
    "Path_NoGoingBack_Counting",
    "SAT",
    "ShortestPath",
    "Sorting",
    "SpiralMatrix",
    "SubsequenceReversalLNDS",
    "UndamagedSubmatrixCounting",
    "WYRLevelingGround",
)
# RlveEnvironmentAdapter(max_difficulty=20).
MAX_LEVEL = 20
# create_instances_same_problem's max_attempts.
GENERATOR_ATTEMPTS = 10
# fixed_env_orchestrator._build_initial_prompt, category "rlve".
PROMPT_SUFFIX = (
    "\n\nPlease reason step by step, and put your final answer within"
    " \\boxed{}."
)
# RLVE's generator gives up on an attempt after 10 s (its thread goes on).
ATTEMPT_TIMEOUT_S = 10
# Seconds the host waits for one problem: every attempt timing out, and a
# margin for the stray threads they leave competing for the interpreter.
GENERATE_TIMEOUT_S = GENERATOR_ATTEMPTS * ATTEMPT_TIMEOUT_S + 60.0

# What the sandbox may import besides the standard library: the packages
# whose site-packages it binds (docs/architecture.md, "Sandbox";
# `spade.sandbox.options` preloads them).
_SANDBOX_PACKAGES = frozenset({"numpy", "math_verify"})

# The reference's extract_boxed_answer (spade/core/utils/parsing.py),
# verbatim but for its name.
_EXTRACT_BOXED = r"""
def _extract_boxed_answer(solution):
    if not solution:
        return None
    patterns = [
        r"\\boxed\{([^{}]+)\}",
        r"\\boxed\{\{([^{}]+)\}\}",
        r"\\boxed\{\{\{([^{}]+)\}\}\}",
    ]
    for pattern in patterns:
        match = re.search(pattern, solution)
        if match:
            return match.group(1).strip()

    boxed_index = solution.rfind("\\boxed")
    start = solution.find("{", boxed_index) if boxed_index >= 0 else -1
    if start < 0:
        return None
    depth = 0
    for index in range(start, len(solution)):
        if solution[index] == "{":
            depth += 1
        elif solution[index] == "}":
            depth -= 1
            if depth == 0:
                content = solution[start + 1 : index].strip()
                for _ in range(2):
                    if content.startswith("{") and content.endswith("}"):
                        content = content[1:-1].strip()
                return content
    return None
"""

# The playing class: RlveGymWrapper's reset/step on the embedded problem.
_WRAPPER = '''
class {cls}:
    """RLVE's {name} at level {level}: one generated problem, one answer.

    reset() shows the problem and asks for the answer in \\\\boxed{{}};
    step() scores the reply with RLVE's verifier (the first boxed answer
    as <answer>...</answer>): 1.0 when fully correct, else 0.0, and ends.
    """

    def __init__(self, max_turns=1, **kwargs):
        self.max_turns = max_turns
        self._task = None

    def reset(self, seed=None):
        self._task = {env_class}()
        self._task.set_config(_CONFIG)
        return _PROMPT + _SUFFIX, {{
            "difficulty": _LEVEL,
            "has_answer": _ANSWER is not None,
        }}

    def step(self, action):
        if self._task is None:
            return "No problem generated. Call reset() first.", 0.0, True, False, {{}}
        boxed = _extract_boxed_answer(action)
        if boxed is not None:
            action = action + "\\n<answer>" + boxed + "</answer>"
        try:
            correct = bool(self._task.verifier(action)["accuracy"])
        except Exception:
            correct = False
        reward = 1.0 if correct else 0.0
        if correct:
            obs = "Correct!"
        else:
            obs = "Incorrect. The answer was: " + str(_ANSWER)
        return obs, reward, True, False, {{
            "correct": correct,
            "difficulty": _LEVEL,
            "expected_answer": str(_ANSWER) if _ANSWER else None,
        }}

    def close(self):
        self._task = None
'''


def env_class_name(name: str) -> str:
  """The playing class's name for RLVE environment `name`."""
  return f"Rlve{name}Env"


def render(problem: dict[str, Any]) -> str:
  """The program for one generated problem (what `_generate` returns)."""
  name, level = problem["name"], problem["level"]
  parts = [
      f'"""RLVE (rlve-gym 0.0.1) {name} at level {level}, problem seed'
      f' {problem["seed"]}.\n\nWritten by spade.environments.rlve: the'
      " playing class, rlve-gym's VerifiableEnvironment and the"
      f' environment\'s module verbatim, and the generated problem.\n"""',
      "import copy\nimport re\nfrom abc import ABC, abstractmethod\n"
      "from typing import Any, Dict, List, Optional, Tuple, Union",
      _WRAPPER.format(
          cls=env_class_name(name),
          name=name,
          level=level,
          env_class=problem["env_class"],
      ),
      "# rlve-gym Gym/environment.py: VerifiableEnvironment, verbatim.",
      problem["base_source"],
      f"# rlve-gym {problem['module_file']}, verbatim but for its imports"
      " of Gym and of packages outside the standard library.",
      problem["module_source"],
      _EXTRACT_BOXED,
      f"_SUFFIX = {PROMPT_SUFFIX!r}",
      f"_LEVEL = {int(level)}",
      f"_PROMPT = {problem['prompt']!r}",
      f"_CONFIG = {problem['config']}",
      f"_ANSWER = {problem['answer']}",
  ]
  return "\n\n".join(parts) + "\n"


class Rlve:
  """The RLVE family: `names` and `program(name, level, seed)`.

  Problems are generated by one worker subprocess, started on the first
  `program` call and stopped by `close()` (or at exit).
  """

  def __init__(self, names=OFFICIAL, max_level: int = MAX_LEVEL):
    self.names = tuple(names)
    self.max_level = max_level
    self._proc = None
    self._lock = threading.Lock()

  def program(self, name: str, level: int, seed: int) -> str:
    """Environment `name`'s program at `level` (clamped to [0, max_level])."""
    return render(self.generate(name, level, seed))

  def generate(self, name: str, level: int, seed: int) -> dict[str, Any]:
    """The generated problem as the worker returns it (see `_generate`)."""
    if name not in self.names:
      raise KeyError(f"{name!r} is not one of this family's {self.names}")
    level = max(0, min(int(level), self.max_level))
    request = {"name": name, "level": level, "seed": int(seed)}
    with self._lock:
      reply = self._ask(request)
      if reply.get("stray_threads"):
        # A timed-out attempt's thread still runs in the worker (RLVE never
        # stops it): replace the worker so it cannot slow the next problem.
        self.close()
    if not reply.get("ok"):
      raise levels.GenerationError(
          f"RLVE could not generate {name} at level {level} (seed {seed}):"
          f" {reply.get('error')}"
      )
    return reply["problem"]

  def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
    if self._proc is None or self._proc.poll() is not None:
      self._start()
    self._proc.stdin.write(json.dumps(request) + "\n")
    self._proc.stdin.flush()
    line = _readline(self._proc, GENERATE_TIMEOUT_S)
    if line is None:
      self.close()
      raise RuntimeError(
          f"the RLVE generator worker gave no answer for {request} in"
          f" {GENERATE_TIMEOUT_S:.0f} s (it was stopped; the next call"
          " starts a new one)"
      )
    return json.loads(line)

  def _start(self) -> None:
    env = dict(os.environ)
    # The worker needs no accelerator; torch and JAX stay off it.
    env.update(CUDA_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu")
    self._proc = subprocess.Popen(  # pylint: disable=consider-using-with
        [sys.executable, "-m", "spade.environments.rlve", "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    atexit.register(self.close)
    hello = _readline(self._proc, GENERATE_TIMEOUT_S)
    if hello is None or not json.loads(hello).get("ok"):
      error = json.loads(hello).get("error") if hello else "no answer"
      self.close()
      raise RuntimeError(
          f"the RLVE generator worker did not start: {error}. Install"
          " rlve-gym==0.0.1 and networkx (pip install -e '.[eval]')"
      )

  def close(self) -> None:
    """Stops the worker (SIGTERM, then SIGKILL after 5 s)."""
    proc, self._proc = self._proc, None
    if proc is None or proc.poll() is not None:
      return
    proc.stdin.close()
    proc.terminate()
    try:
      proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()


def _readline(proc: subprocess.Popen, timeout: float) -> str | None:
  """One line of the worker's stdout, or None if none comes in `timeout`."""
  out: list[str] = []
  reader = threading.Thread(
      target=lambda: out.append(proc.stdout.readline()), daemon=True
  )
  reader.start()
  reader.join(timeout)
  return out[0] if out and out[0] else None


# -- the worker (its own process: RLVE's global-state effects stay there) ----


def _plain(x):
  """Numpy scalars and arrays as Python values, so `repr` is a literal."""
  if hasattr(x, "tolist") and type(x).__module__ == "numpy":
    return x.tolist()
  if isinstance(x, dict):
    return {_plain(k): _plain(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return type(x)(_plain(v) for v in x)
  return x


def _literal(x) -> str:
  """`repr(x)`, checked to read back as the same value."""
  text = repr(_plain(x))
  if ast.literal_eval(text) != _plain(x):
    raise ValueError(f"{type(x).__name__} value does not round-trip: {text}")
  return text


def _portable_source(source: str) -> str:
  """A module's source without its imports of `Gym` or of packages the
  sandbox lacks (top-level statements only)."""
  lines = source.splitlines()
  drop = set()
  for node in ast.parse(source).body:
    if isinstance(node, ast.Import):
      roots = [a.name.split(".")[0] for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      roots = [(node.module or "").split(".")[0]]
    else:
      continue
    if any(
        r not in sys.stdlib_module_names and r not in _SANDBOX_PACKAGES
        for r in roots
    ):
      drop.update(range(node.lineno - 1, node.end_lineno))
  return "\n".join(l for i, l in enumerate(lines) if i not in drop)


def _generate(name: str, level: int, seed: int) -> dict[str, Any]:
  """One problem, as create_instances_same_problem draws it."""
  # pylint: disable=g-import-not-at-top
  import inspect
  from Gym import environment as base
  from Gym.environments import identifier2environment
  from Gym.parameter_controllers import identifier2controller

  env_class = identifier2environment[name]
  controller_class = identifier2controller[name]
  rng = random.Random(seed)
  for _ in range(GENERATOR_ATTEMPTS):
    controller = controller_class()
    for _ in range(level):
      controller.update()
    parameter = rng.choice(controller.get_parameter_list())
    problem_seed = rng.randint(0, 2**31 - 1)
    env = env_class()
    if env.generator(
        seed=problem_seed, parameter=parameter, timeout_second=ATTEMPT_TIMEOUT_S
    ):
      break
  else:
    raise RuntimeError(
        f"RLVE generator failed {GENERATOR_ATTEMPTS} times for {name} at"
        f" difficulty={level}"
    )
  params = env.parameter or {}
  module = sys.modules[env_class.__module__]
  base_tree = ast.parse(inspect.getsource(base))
  (base_class,) = [
      n
      for n in base_tree.body
      if isinstance(n, ast.ClassDef) and n.name == "VerifiableEnvironment"
  ]
  return {
      "name": name,
      "level": level,
      "seed": seed,
      "env_class": env_class.__name__,
      "prompt": env.prompt_generator(),
      "config": _literal(env.get_config()),
      "answer": _literal(
          params.get("reference_answer", params.get("gold_answer"))
      ),
      "base_source": ast.get_source_segment(
          inspect.getsource(base), base_class
      ),
      "module_file": os.path.relpath(
          module.__file__, os.path.dirname(os.path.dirname(base.__file__))
      ),
      "module_source": _portable_source(inspect.getsource(module)),
  }


def _stray_threads() -> bool:
  """Whether a generator thread still runs (a timed-out attempt's); a
  finished attempt's executor thread ends within moments."""
  for t in threading.enumerate():
    if t is not threading.main_thread():
      t.join(1.0)
  return threading.active_count() > 1


def _serve() -> None:
  """The worker: one JSON request per stdin line, one reply per line."""
  out = sys.stdout
  # RLVE's modules print nothing we want; keep stdout for the replies.
  sys.stdout = sys.stderr
  try:
    import Gym.environments  # pylint: disable=g-import-not-at-top,unused-import
    import Gym.parameter_controllers  # pylint: disable=g-import-not-at-top,unused-import
  except Exception as e:  # pylint: disable=broad-except
    out.write(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"}))
    out.write("\n")
    out.flush()
    return
  out.write(json.dumps({"ok": True}) + "\n")
  out.flush()
  for line in sys.stdin:
    request = json.loads(line)
    try:
      reply = {"ok": True, "problem": _generate(**request)}
    except Exception as e:  # pylint: disable=broad-except
      reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    reply["stray_threads"] = _stray_threads()
    out.write(json.dumps(reply) + "\n")
    out.flush()


levels.register("rlve", Rlve())

if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
  _serve()
