"""Stable seeds for every random choice of the loop."""

from __future__ import annotations

import hashlib
from typing import Any


def seed_for(*parts: Any) -> int:
  """A stable 31-bit seed from any parts (same on every process and run)."""
  digest = hashlib.sha256(repr(parts).encode()).digest()
  return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF
