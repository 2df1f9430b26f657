"""The static pass of validation: escapes an AST shows, refused before a run.

`check` refuses the file, process, network and introspection escapes an
AST pass can see, and reports a syntax error as such. It is a filter that
gives the designer a clear reason, not the security boundary: the sandbox
stays the real wall. Standard library only (the sandbox worker imports it
through the validator).
"""

from __future__ import annotations

import ast
import dataclasses

# Modules whose import is refused, by the escape each one is for.
_DENIED_MODULES = {
    **dict.fromkeys(
        "os posix nt shutil pathlib tempfile glob fcntl mmap fileinput"
        " zipfile tarfile sqlite3 shelve dbm".split(),
        "file",
    ),
    **dict.fromkeys(
        "subprocess multiprocessing threading _thread concurrent signal"
        " resource pty pdb faulthandler atexit".split(),
        "process",
    ),
    **dict.fromkeys(
        "socket ssl urllib http requests httpx ftplib smtplib telnetlib"
        " asyncio selectors select xmlrpc webbrowser aiohttp"
        " socketserver".split(),
        "network",
    ),
    **dict.fromkeys(
        "ctypes cffi importlib imp builtins __builtin__ gc inspect code"
        " codeop runpy zipimport marshal pickle".split(),
        "introspection",
    ),
}

# Calls of these builtins are refused.
_DENIED_CALLS = {
    "eval": "introspection",
    "exec": "introspection",
    "compile": "introspection",
    "__import__": "introspection",
    "globals": "introspection",
    "breakpoint": "process",
    "open": "file",
    "input": "process",
    "help": "process",
    "exit": "process",
    "quit": "process",
}

# Attribute names that reach interpreter internals (frames, globals,
# the class graph that leads to every loaded class).
_DENIED_ATTRS = frozenset(
    "__subclasses__ __globals__ __builtins__ __code__ __closure__ __bases__"
    " __base__ __mro__ __self__ __loader__ __spec__ __import__ __reduce__"
    " __reduce_ex__ __getattribute__ __dictoffset__ mro f_globals f_locals"
    " f_back f_builtins f_code gi_frame gi_code cr_frame cr_code ag_frame"
    " tb_frame tb_next func_globals".split()
)

# Names that must not be read or rebound.
_DENIED_NAMES = frozenset("__builtins__ __loader__ __spec__ __import__".split())

# sys attributes that open an escape or end the process.
_DENIED_SYS = frozenset(
    "modules _getframe settrace setprofile exit meta_path path_hooks"
    " path_importer_cache addaudithook _current_frames stdin __stdout__"
    " __stderr__ __stdin__ breakpointhook excepthook setrecursionlimit"
    " monitoring remote_exec".split()
)


@dataclasses.dataclass(frozen=True)
class StaticFinding:
  """Why a program was refused before it ran.

  Attributes:
    reason: a short code from `contract.REASONS` ("syntax" or "static").
    message: what was wrong and what to do.
    lineno: the program line, when known.
  """

  reason: str
  message: str
  lineno: int | None = None


class _Escapes(ast.NodeVisitor):
  """Collects the first escape attempt the AST shows."""

  def __init__(self):
    self.found: StaticFinding | None = None
    self._sys_aliases = set()

  def _refuse(self, node: ast.AST, kind: str, what: str) -> None:
    if self.found is None:
      line = getattr(node, "lineno", None)
      self.found = StaticFinding(
          "static",
          f"{kind} escape refused: {what} (line {line}); environments may"
          " use only in-memory computation with the standard library,"
          " numpy and math_verify",
          line,
      )

  def _check_module(self, node: ast.AST, name: str) -> None:
    top = name.split(".")[0]
    if top in _DENIED_MODULES:
      self._refuse(node, _DENIED_MODULES[top], f"import of {name}")

  def visit_Import(self, node: ast.Import) -> None:  # pylint: disable=invalid-name
    for alias in node.names:
      self._check_module(node, alias.name)
      if alias.name == "sys":
        self._sys_aliases.add(alias.asname or "sys")
    self.generic_visit(node)

  def visit_ImportFrom(self, node: ast.ImportFrom) -> None:  # pylint: disable=invalid-name
    module = node.module or ""
    self._check_module(node, module)
    if module == "sys":
      for alias in node.names:
        if alias.name in _DENIED_SYS:
          self._refuse(node, "introspection", f"from sys import {alias.name}")
    if module == "io":
      for alias in node.names:
        if alias.name in ("open", "FileIO", "open_code"):
          self._refuse(node, "file", f"from io import {alias.name}")
    self.generic_visit(node)

  def visit_Call(self, node: ast.Call) -> None:  # pylint: disable=invalid-name
    func = node.func
    if isinstance(func, ast.Name) and func.id in _DENIED_CALLS:
      self._refuse(node, _DENIED_CALLS[func.id], f"call of {func.id}()")
    if (
        isinstance(func, ast.Name)
        and func.id in ("getattr", "setattr", "delattr", "hasattr")
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
        and (
            node.args[1].value.startswith("__")
            or node.args[1].value in _DENIED_ATTRS
        )
    ):
      self._refuse(
          node,
          "introspection",
          f"{func.id}() of the special attribute {node.args[1].value!r}",
      )
    self.generic_visit(node)

  def visit_Attribute(self, node: ast.Attribute) -> None:  # pylint: disable=invalid-name
    if node.attr in _DENIED_ATTRS:
      self._refuse(node, "introspection", f"attribute .{node.attr}")
    if (
        isinstance(node.value, ast.Name)
        and node.value.id in self._sys_aliases
        and node.attr in _DENIED_SYS
    ):
      self._refuse(node, "introspection", f"sys.{node.attr}")
    if (
        isinstance(node.value, ast.Name)
        and node.value.id == "io"
        and node.attr in ("open", "FileIO", "open_code")
    ):
      self._refuse(node, "file", f"io.{node.attr}")
    self.generic_visit(node)

  def visit_Name(self, node: ast.Name) -> None:  # pylint: disable=invalid-name
    if node.id in _DENIED_NAMES:
      self._refuse(node, "introspection", f"use of the name {node.id}")
    self.generic_visit(node)


def check(source: str) -> StaticFinding | None:
  """Parses a program and looks for escape attempts.

  Args:
    source: the program's Python source.

  Returns:
    None when the program parses and shows no escape; otherwise a
    `StaticFinding` with reason "syntax" or "static".
  """
  try:
    tree = ast.parse(source)
  except (SyntaxError, ValueError) as e:
    line = getattr(e, "lineno", None)
    return StaticFinding(
        "syntax",
        f"{type(e).__name__} (line {line}): {e}; fix the Python syntax",
        line,
    )
  visitor = _Escapes()
  visitor.visit(tree)
  return visitor.found
