"""What a run prints: a few lines per phase, live rates inside long steps.

The console belongs to the user: library INFO lines (absl, orbax, jax) are
off unless `spade.main --verbose` asks for them (`quiet`), and SPADE's own
lines come from here, on process 0 only, through `tqdm.write` so they do not
break the iteration bar.

* `say(fmt, *args)`: one line; `refresh(fmt, *args)`: a progress line, rewritten
  in place on a terminal.
* `Ticker`: a long step's live line (a line at most every `every` seconds
  with the rate, rows and an ETA), then one closing line.
* `first_compile(kind, shape)`: names a first compilation ("compiling the
  designer sampler for 2 x 4096, once per shape") so a silent minute reads
  as what it is.
* `muted()`: a context with none of these lines (a driver's own instead).
* `current_ticker`: the ticker a compiled program's progress callback
  reports to (`spade.sampling.sampler.Sampler.report_every`).
"""

from __future__ import annotations

import contextlib
import logging as py_logging
import os
import shutil
import sys
import threading
import time
from typing import Iterator

from absl import logging
import tqdm

_TICKER: list["Ticker | None"] = [None]
_MUTED = [False]
_COMPILED: set[tuple] = set()
# Libraries whose INFO lines are not for the user.
_NOISY = ("absl", "orbax", "jax", "jax._src", "etils", "tensorflow")


def _process_zero() -> bool:
  # jax is not imported here: `say` must work before the backend starts.
  if _MUTED[0]:
    return False
  jax = sys.modules.get("jax")
  return jax is None or jax.process_index() == 0


@contextlib.contextmanager
def muted() -> Iterator[None]:
  """Nothing from `say`, `refresh` or the loop's iteration bar inside: a
  driver that runs many short trainings (experiments/curriculum.py) prints
  its own lines instead."""
  before = _MUTED[0]
  _MUTED[0] = True
  try:
    yield
  finally:
    _MUTED[0] = before


def is_muted() -> bool:
  """Whether `muted` is in effect."""
  return _MUTED[0]


def say(fmt: str, *args) -> None:
  """Prints one `spade:` line on process 0."""
  if _process_zero():
    tqdm.tqdm.write("spade: " + (fmt % args if args else fmt), file=sys.stderr)


def refresh(fmt: str, *args) -> None:
  """A progress line: on a terminal it rewrites the line in place (the next
  `say` or `refresh` replaces it); elsewhere (a log file) it is a line."""
  if not _process_zero():
    return
  if not sys.stderr.isatty():
    say(fmt, *args)
    return
  text = "spade: " + (fmt % args if args else fmt)
  width = shutil.get_terminal_size((120, 20)).columns - 1
  sys.stderr.write("\r" + text[:width] + "\x1b[K")
  sys.stderr.flush()


def quiet(verbose: bool = False) -> None:
  """Library INFO lines off (unless `verbose`), and `no_tpu_probe`."""
  if not verbose:
    logging.set_verbosity(logging.WARNING)
    for name in _NOISY:
      py_logging.getLogger(name).setLevel(py_logging.WARNING)
  no_tpu_probe()


def no_tpu_probe() -> None:
  """On a host without TPU (or CUDA) devices, JAX starts on the CPU without
  probing for a TPU: libtpu, when installed, otherwise prints a page of
  warnings on every start. Call before JAX starts its backends (loading a
  config may already)."""
  if "JAX_PLATFORMS" not in os.environ and not _has_tpu_devices():
    try:
      import jax_plugins.xla_cuda12  # pylint: disable=g-import-not-at-top,unused-import  # noqa
    except ImportError:
      os.environ["JAX_PLATFORMS"] = "cpu"
      if "jax" in sys.modules:
        # jax read the variable at import; its config still applies until
        # the first backend starts.
        sys.modules["jax"].config.update("jax_platforms", "cpu")
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _has_tpu_devices() -> bool:
  """TPU chips appear as /dev/accel* (v4 and later) or /dev/vfio/* (v5e+)."""
  try:
    names = os.listdir("/dev")
  except OSError:
    return False
  if any(n.startswith("accel") for n in names):
    return True
  try:
    return any(n != "vfio" for n in os.listdir("/dev/vfio"))
  except OSError:
    return False


def first_compile(kind: str, shape: tuple, note: str = "once per shape"):
  """Says "compiling <kind> for a x b, <note>" the first time `shape` of
  `kind` is seen in this process; returns whether it was the first."""
  key = (kind, tuple(shape))
  if key in _COMPILED:
    return False
  _COMPILED.add(key)
  say("compiling %s for %s, %s", kind, " x ".join(map(str, shape)), note)
  return True


class Ticker:
  """A long step's progress: `update(done)` prints a line at most every
  `every` seconds; `close(done)` prints the closing line (unless the step
  took under `quiet_under` seconds and printed nothing).

  Lines read "<what>: 320/1,024 tok, 41.0 tok/s, 8/16 rows live, ETA 17s"
  (the ETA from `total`, an upper bound where rows may stop early).
  """

  def __init__(
      self,
      what: str,
      *,
      total: int | None = None,
      unit: str = "tok",
      every: float = 10.0,
      quiet_under: float = 5.0,
  ):
    self.what, self.total, self.unit, self.every = what, total, unit, every
    self.quiet_under = quiet_under
    self.start = self.last = time.perf_counter()
    self.done = 0

  def update(self, done: int, *, live: int | None = None, rows: int = 0):
    """Records progress `done`; prints when `every` seconds have passed."""
    self.done = int(done)
    now = time.perf_counter()
    if now - self.last < self.every:
      return
    self.last = now
    rate = self.done / max(now - self.start, 1e-9)
    parts = [f"{self.done:,}" + (f"/{self.total:,}" if self.total else "")]
    parts[0] += f" {self.unit}"
    parts.append(f"{rate:.1f} {self.unit}/s")
    if live is not None and rows:
      parts.append(f"{live}/{rows} rows live")
    if self.total and rate > 0:
      parts.append(f"ETA {max(self.total - self.done, 0) / rate:.0f}s")
    refresh("%s: %s", self.what, ", ".join(parts))

  def close(self, done: int | None = None, extra: str = "") -> float:
    """Prints "<what>: N unit in T s (R unit/s)"; returns the seconds."""
    if done is not None:
      self.done = int(done)
    dt = time.perf_counter() - self.start
    if dt < self.quiet_under and self.last == self.start:
      return dt  # a short step that printed nothing needs no closing line
    say(
        "%s: %s %s in %.1fs (%.1f %s/s)%s",
        self.what,
        f"{self.done:,}",
        self.unit,
        dt,
        self.done / max(dt, 1e-9),
        self.unit,
        extra,
    )
    return dt


@contextlib.contextmanager
def ticking(ticker: Ticker) -> Iterator[Ticker]:
  """Makes `ticker` the one compiled programs' progress callbacks feed."""
  previous, _TICKER[0] = _TICKER[0], ticker
  try:
    yield ticker
  finally:
    _TICKER[0] = previous


def current_ticker() -> Ticker | None:
  """The ticker of the step running now, if any."""
  return _TICKER[0]


@contextlib.contextmanager
def heartbeat(what: str, every: float = 10.0) -> Iterator[None]:
  """A line every `every` seconds while one opaque call runs (a compiled
  update, a first compilation): "<what>: 20s so far"."""
  if not _process_zero():
    yield
    return
  stop = threading.Event()
  start = time.perf_counter()

  def beat():
    while not stop.wait(every):
      refresh("%s: %.0fs so far", what, time.perf_counter() - start)

  thread = threading.Thread(target=beat, daemon=True)
  thread.start()
  try:
    yield
  finally:
    stop.set()
    thread.join()
