"""A `gymnasium.Env` over one sandboxed environment program.

Observations and actions are text (`gymnasium.spaces.Text`); the program runs
in a `spade.sandbox.SandboxPool`, never in this process, so any program, the
designer's included, can be used wherever a gym environment is expected:

  with SandboxPool("gvisor", 1) as pool:
    env = ProgramEnv(source, pool)
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("\\\\boxed{up}")
"""

from __future__ import annotations

import string
from typing import Any

import gymnasium
from gymnasium import spaces

from spade.environments import contract
from spade.sandbox import SandboxError
from spade.sandbox import SandboxPool

# Longest action the adapter accepts: a whole model reply, reasoning included.
MAX_ACTION_CHARS = 100_000

# What `Text.sample()` draws from: printable ASCII, Latin-1 letters and the
# general punctuation block (dashes, quotes) that observations use.
_CHARSET = frozenset(
    string.printable
    + "".join(chr(c) for c in range(0xA0, 0x100))
    + "".join(chr(c) for c in range(0x2010, 0x2030))
)


class AnyText(spaces.Text):
  """`spaces.Text` whose `contains` accepts any str of an allowed length.

  Observations are free text written by programs (any Unicode); a fixed
  charset would reject valid observations, so membership checks only the
  type and the length, while sampling still draws from the charset.
  """

  def contains(self, x: Any) -> bool:
    return isinstance(x, str) and self.min_length <= len(x) <= self.max_length


class ProgramEnv(gymnasium.Env):
  """One environment program, sandboxed, as a gymnasium environment.

  An exception in the program's `step` is the reference's outcome: the
  observation "Error: ...", reward -1 (`contract.STEP_ERROR_REWARD`) and
  `terminated=True`. Other failures inside the sandbox (a crash, a timeout,
  a lost sandbox) end the episode with reward 0. Both set `info["error"]`
  (the reason) and `info["message"]`; the next `reset` creates a fresh
  environment. Tool calls run through `execute_tool`, as in play, without
  spending one of the environment's turns.
  """

  metadata = {"render_modes": ["ansi"]}

  def __init__(
      self,
      source: str,
      pool: SandboxPool | None = None,
      *,
      backend: str = "gvisor",
      kwargs: dict | None = None,
      max_obs_chars: int = contract.MAX_OBS_CHARS,
      render_mode: str | None = None,
  ):
    """Loads the program in the sandbox.

    Args:
      source: the environment program.
      pool: the sandbox pool to run it in; None starts a private one-sandbox
        pool with `backend` (closed with this environment).
      backend: backend of a private pool ("gvisor", "bwrap", "none").
      kwargs: keyword arguments of the program's class.
      max_obs_chars: the observation space's max_length.
      render_mode: None or "ansi" (render() returns the last observation).

    Raises:
      SandboxError: the program did not load (its reason and message).
    """
    if render_mode not in (None, "ansi"):
      raise ValueError(f"render_mode must be None or 'ansi', got {render_mode}")
    self.render_mode = render_mode
    self._owns_pool = pool is None
    self.pool = (
        SandboxPool(backend, num_sandboxes=1, warm_spare=False)
        if pool is None
        else pool
    )
    self._source = source
    self._kwargs = kwargs
    self.observation_space = AnyText(
        max_length=max_obs_chars, min_length=0, charset=_CHARSET
    )
    self.action_space = AnyText(
        max_length=MAX_ACTION_CHARS, min_length=0, charset=_CHARSET
    )
    self.handle: int | None = None
    self._last_obs = ""
    try:
      self.handle = self.pool.create(source, kwargs)
    except BaseException:
      self.close()
      raise

  def reset(
      self, *, seed: int | None = None, options: dict | None = None
  ) -> tuple[str, dict]:
    """Resets the program; without a seed, draws one from `np_random`."""
    del options
    super().reset(seed=seed)
    if seed is None:
      # Gymnasium's seeding decides the episode, so runs are reproducible.
      seed = int(self.np_random.integers(0, 2**31 - 1))
    if self.handle is None:
      self.handle = self.pool.create(self._source, self._kwargs)
    obs, info = self.pool.reset(self.handle, seed)
    self._last_obs = obs
    return obs, info

  def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
    """Plays one reply; see the class docstring for failures."""
    if self.handle is None:
      raise RuntimeError("call reset() before step()")
    r = self.pool.step(self.handle, str(action))
    if not r.get("ok"):
      self.pool.close_env(self.handle)
      self.handle = None
      message = str(r.get("message", ""))
      info = {"error": r.get("reason"), "message": message}
      if r.get("reason") == "exception":
        # The reference's wrapper: f"Error: {e}", -1.0, terminated.
        self._last_obs = f"Error: {message.split(chr(10), 1)[0]}"
        return self._last_obs, contract.STEP_ERROR_REWARD, True, False, info
      self._last_obs = f"[environment error: {r.get('reason')}]"
      return self._last_obs, 0.0, True, False, info
    self._last_obs = r["obs"]
    return (
        r["obs"],
        float(r["reward"]),
        bool(r["terminated"]),
        bool(r["truncated"]),
        dict(r.get("info") or {}),
    )

  def _call(self, method: str, default: Any) -> Any:
    if self.handle is None:
      raise RuntimeError("call reset() first")
    try:
      return self.pool.call(self.handle, method)
    except SandboxError as e:
      # The worker reports a missing method as the AttributeError it raised.
      if e.reason == "exception" and e.message.startswith("AttributeError"):
        return default
      raise

  def hint(self) -> str | None:
    """The program's privileged hint for this episode (None without one)."""
    return self._call("hint", None)

  def solution(self) -> Any:
    """The program's solution for this episode (list of actions or text)."""
    return self._call("solution", None)

  def get_tools(self) -> list[dict]:
    """OpenAI-style tool schemas (tool-use programs), else []."""
    return self._call("get_tools", [])

  def execute_tool(self, name: str, arguments: Any) -> dict:
    """Runs one tool call without spending a turn: {"output", "returncode"}.

    A program without `execute_tool` (a game) answers as the reference's
    wrapper does, with returncode 1.
    """
    if self.handle is None:
      raise RuntimeError("call reset() first")
    try:
      return self.pool.call(self.handle, "execute_tool", name, arguments)
    except SandboxError as e:
      if e.reason == "exception" and e.message.startswith("AttributeError"):
        return {"output": "execute_tool not supported", "returncode": 1}
      raise

  def render(self) -> str | None:
    """The last observation, in "ansi" mode."""
    return self._last_obs if self.render_mode == "ansi" else None

  def close(self) -> None:
    """Ends the program's process, and the pool when this env owns it."""
    if getattr(self, "handle", None) is not None:
      self.pool.close_env(self.handle)
      self.handle = None
    if getattr(self, "_owns_pool", False) and getattr(self, "pool", None):
      self.pool.close()
      self.pool = None


# `gymnasium.make(ENV_ID, source=..., pool=...)` builds a ProgramEnv.
ENV_ID = "spade/Program-v0"
if ENV_ID not in gymnasium.registry:
  gymnasium.register(id=ENV_ID, entry_point=ProgramEnv)
