"""Near-duplicate detection for environment programs.

Two signatures per program, both blind to identifier names, so a copy with
renamed variables, methods or classes is caught:

  * a normalised-AST fingerprint: the program's AST with every identifier that
    is not a builtin or a dunder renamed to its order of first appearance
    (`v0`, `v1`, ...; attribute names in their own series `a0`, `a1`, ...)
    and docstrings dropped, hashed. Equal fingerprints mean
    the same program up to names and docstrings; programs that do not parse
    have none.
  * MinHashes of the program's token 5-shingles, comments and layout
    dropped: one with identifiers normalised the same way, one with them as
    written (an added or removed name renumbers every later name in the
    first); the fraction of equal MinHash values estimates the Jaccard
    similarity of the shingle sets (standard error about 0.04 with 128
    hashes), and the higher of the two estimates counts, which catches
    copies with small edits as well.

Two programs are near-duplicates when their fingerprints are equal or their
estimated similarity reaches the threshold (`config.memory.
duplicate_threshold`). Everything here is deterministic, so the archive makes
the same decisions on every process.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import io
import keyword
import re
import tokenize

import numpy as np

NUM_PERM = 128
SHINGLE = 5
_PRIME = np.uint64((1 << 61) - 1)
# Fixed hash-family parameters: a < 2**31 and 32-bit inputs keep a * x + b
# below 2**64, so the uint64 arithmetic is exact.
_PARAMS = np.random.default_rng(20261130)
_A = _PARAMS.integers(1, 1 << 31, size=NUM_PERM, dtype=np.uint64)
_B = _PARAMS.integers(0, 1 << 32, size=NUM_PERM, dtype=np.uint64)
del _PARAMS

_KEEP = frozenset(dir(builtins)) | frozenset(keyword.kwlist)
_SKIP_TOKENS = (
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.ENCODING,
    tokenize.ENDMARKER,
)
_FALLBACK_TOKEN = re.compile(
    r"[A-Za-z_]\w*|\d+(?:\.\d+)?|\"[^\"]*\"|'[^']*'|\S"
)


def _keep_name(name: str) -> bool:
  return name in _KEEP or (name.startswith("__") and name.endswith("__"))


class _Names:
  """Maps identifiers to `v0, v1, ...` by order of first appearance.

  Attribute names (after a dot) get their own series, `a0, a1, ...`: in
  `self.limit = limit` the two names coincide by habit, and a copy that
  renames only one of them should still match.
  """

  def __init__(self):
    self._map: dict[str, str] = {}
    self._attrs: dict[str, str] = {}

  def __call__(self, name: str, attribute: bool = False) -> str:
    if _keep_name(name):
      return name
    table, prefix = (self._attrs, "a") if attribute else (self._map, "v")
    if name not in table:
      table[name] = f"{prefix}{len(table)}"
    return table[name]


def _canonical_string(literal: str) -> str:
  """One spelling per string value: 'a', "a" and \'\'\'a\'\'\' are the same."""
  try:
    return repr(ast.literal_eval(literal))
  except (ValueError, SyntaxError):  # f-strings are not literals
    return literal


def code_tokens(code: str, rename: bool = True) -> list[str]:
  """Returns the program's tokens with identifiers normalised.

  Comments, blank lines and newlines are dropped; indentation is kept as
  INDENT/DEDENT tokens (it is structure in Python); string literals are
  spelled canonically. Code that `tokenize`
  rejects is split by a simple regular expression instead, so even a broken
  program has a signature.

  Args:
    code: Python source.
    rename: rename identifiers by order of first appearance (False: keep
      them as written).

  Returns:
    The token strings.
  """
  names = _Names() if rename else (lambda name, attribute=False: name)
  out = []
  try:
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
      if tok.type in _SKIP_TOKENS:
        continue
      if tok.type == tokenize.NAME:
        out.append(names(tok.string, attribute=bool(out) and out[-1] == "."))
      elif tok.type == tokenize.INDENT:
        out.append("<INDENT>")
      elif tok.type == tokenize.DEDENT:
        out.append("<DEDENT>")
      elif tok.type == tokenize.STRING:
        out.append(_canonical_string(tok.string))
      else:
        out.append(tok.string)
    return out
  except (tokenize.TokenError, IndentationError, SyntaxError):
    out = []
    names = _Names() if rename else (lambda name, attribute=False: name)
    for tok in _FALLBACK_TOKEN.findall(code):
      if tok[0].isalpha() or tok[0] == "_":
        tok = names(tok, attribute=bool(out) and out[-1] == ".")
      out.append(tok)
    return out


def _shingle_hashes(tokens: list[str]) -> np.ndarray:
  if not tokens:
    tokens = ["<EMPTY>"]
  width = min(SHINGLE, len(tokens))
  hashes = set()
  for i in range(len(tokens) - width + 1):
    shingle = "\x1f".join(tokens[i : i + width]).encode()
    hashes.add(
        int.from_bytes(
            hashlib.blake2b(shingle, digest_size=4).digest(), "little"
        )
    )
  return np.fromiter(sorted(hashes), dtype=np.uint64)


# The signature scheme, saved with an archive's signatures: a restore that
# finds another scheme recomputes them from the code.
SCHEME = "renamed+verbatim-5"


def _minhash_of(tokens: list[str]) -> np.ndarray:
  x = _shingle_hashes(tokens)
  values = (x[:, None] * _A[None, :] + _B[None, :]) % _PRIME
  return values.min(axis=0)


def minhash(code: str) -> np.ndarray:
  """Returns the program's signature, uint64[2 * NUM_PERM]: two MinHashes.

  The first half is over the tokens with names renamed by their order of
  first appearance (a copy that only renames matches it), the second over
  the tokens as written (a copy that adds or drops a name matches it: one
  name added near the top renumbers every later name in the first half; a
  copy of the designer prompt's example with `import random, re, math, time`
  and one attribute dropped scored 0.09 there and 0.98 here).
  """
  return np.concatenate(
      [
          _minhash_of(code_tokens(code)),
          _minhash_of(code_tokens(code, rename=False)),
      ]
  )


def similarity(signature: np.ndarray, others: np.ndarray) -> np.ndarray:
  """Estimated Jaccard similarity of one signature to each row of `others`:
  the higher of the renamed and the verbatim tokens' estimates."""
  others = np.asarray(others).reshape(-1, 2, NUM_PERM)
  equal = others == np.asarray(signature).reshape(1, 2, NUM_PERM)
  return equal.mean(axis=2).max(axis=1)


class _Normaliser(ast.NodeTransformer):
  """Renames identifiers by first appearance and drops docstrings."""

  def __init__(self):
    self.names = _Names()

  def _drop_docstring(self, node):
    body = getattr(node, "body", None)
    if (
        isinstance(body, list)
        and body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
      node.body = body[1:] or [ast.Pass()]

  def generic_visit(self, node):
    if isinstance(
        node,
        (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef),
    ):
      self._drop_docstring(node)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      node.name = self.names(node.name)
    elif isinstance(node, ast.Name):
      node.id = self.names(node.id)
    elif isinstance(node, ast.arg):
      node.arg = self.names(node.arg)
    elif isinstance(node, ast.Attribute):
      node.attr = self.names(node.attr, attribute=True)
    elif isinstance(node, ast.keyword) and node.arg is not None:
      node.arg = self.names(node.arg)
    elif isinstance(node, ast.ExceptHandler) and node.name:
      node.name = self.names(node.name)
    elif isinstance(node, (ast.Global, ast.Nonlocal)):
      node.names = [self.names(n) for n in node.names]
    elif isinstance(node, ast.alias) and node.asname:
      node.asname = self.names(node.asname)
    return super().generic_visit(node)


def ast_fingerprint(code: str) -> str | None:
  """Hash of the program's AST up to identifier names and docstrings.

  Args:
    code: Python source.

  Returns:
    16 hex digits, or None when the code does not parse.
  """
  try:
    tree = ast.parse(code)
  except (SyntaxError, ValueError):
    return None
  tree = _Normaliser().visit(tree)
  dump = ast.dump(tree, annotate_fields=False, include_attributes=False)
  return hashlib.sha256(dump.encode()).hexdigest()[:16]


def diversity(signatures) -> float:
  """One minus the mean pairwise estimated similarity of the programs.

  Args:
    signatures: uint64[m, 2 * NUM_PERM] signatures (`minhash`), or a list
      of program sources (their signatures are computed).

  Returns:
    A score in [0, 1]: 0 when all programs are the same, near 1 when no two
    share shingles; 0.0 for fewer than two programs.
  """
  m = len(signatures)
  if m < 2:
    return 0.0
  if isinstance(signatures[0], str):
    signatures = [minhash(code) for code in signatures]
  sig = np.asarray(signatures)
  total = 0.0
  for i in range(m - 1):
    total += float(similarity(sig[i], sig[i + 1 :]).sum())
  return 1.0 - total / (m * (m - 1) / 2)
