"""No two modules of `spade`, and no two of its folders, import each other.

The imports are read with `ast`, not by importing: every `import` statement
counts, at module level and inside functions, since a function-level import
is how a cycle hides (it works until someone moves it to the top). `from
package import name` counts as importing `package.name` when that is a
module, and `package` otherwise.

Folders: `spade/X/...` is the folder `spade.X` and a top-level module
(`spade.main`, `spade.config`) a folder of its own; a folder imports
another when any of its modules does, so dependencies between folders run
one way, as docs/architecture.md draws them.

The iteration (`spade.selfplay.loop.iteration`) stays 70 lines or fewer:
the phases hold the detail.
"""

import ast
import pathlib

import pytest

_ROOT = pathlib.Path(__file__).resolve().parent.parent
_PACKAGE = "spade"


def _modules() -> dict[str, pathlib.Path]:
  """Dotted name -> file of every module under spade/."""
  out = {}
  for path in sorted((_ROOT / _PACKAGE).rglob("*.py")):
    parts = path.relative_to(_ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
      parts = parts[:-1]
    out[".".join(parts)] = path
  return out


def _imports(name: str, path: pathlib.Path, known: set[str]) -> set[str]:
  """The modules of `known` that the module `name` imports anywhere."""
  is_package = path.name == "__init__.py"
  package = name if is_package else name.rpartition(".")[0]
  found = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      targets = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      if node.level:
        base = package.split(".")
        base = base[: len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
      else:
        source = node.module or ""
      targets = []
      for alias in node.names:
        sub = f"{source}.{alias.name}"
        targets.append(sub if sub in known else source)
    else:
      continue
    for target in targets:
      # `import a.b.c` binds a module of ours even when it names an object's
      # parent; walk up to the nearest module we know.
      while target and target not in known:
        target = target.rpartition(".")[0]
      if target and target != name:
        found.add(target)
  return found


def import_graph() -> dict[str, set[str]]:
  """Module -> the spade modules it imports (see the module docstring)."""
  modules = _modules()
  known = set(modules)
  return {name: _imports(name, path, known) for name, path in modules.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """One cycle (a -> ... -> a) per strongly connected component of size > 1.

  Tarjan's algorithm, iteratively (a deep import chain must not hit the
  recursion limit).
  """
  index, low, on_stack, stack, sccs = {}, {}, set(), [], []
  counter = 0
  for root in sorted(graph):
    if root in index:
      continue
    work = [(root, iter(sorted(graph[root])))]
    index[root] = low[root] = counter
    counter += 1
    stack.append(root)
    on_stack.add(root)
    while work:
      node, children = work[-1]
      child = next(children, None)
      if child is not None:
        if child not in index:
          index[child] = low[child] = counter
          counter += 1
          stack.append(child)
          on_stack.add(child)
          work.append((child, iter(sorted(graph.get(child, ())))))
        elif child in on_stack:
          low[node] = min(low[node], index[child])
        continue
      work.pop()
      if work:
        parent = work[-1][0]
        low[parent] = min(low[parent], low[node])
      if low[node] == index[node]:
        component = set()
        while True:
          member = stack.pop()
          on_stack.discard(member)
          component.add(member)
          if member == node:
            break
        if len(component) > 1:
          sccs.append(component)
  return [_cycle_in(graph, component) for component in sccs]


def _cycle_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
  """A shortest cycle through the component's first module (breadth-first)."""
  start = min(component)
  previous = {start: None}
  queue = [start]
  while queue:
    node = queue.pop(0)
    for child in sorted(graph[node] & component):
      if child == start:
        path = [node]
        while previous[path[-1]] is not None:
          path.append(previous[path[-1]])
        return [start] + path[::-1][1:] + [start]
      if child not in previous:
        previous[child] = node
        queue.append(child)
  raise AssertionError(f"no cycle found in component {sorted(component)}")


def folder(module: str) -> str:
  """The folder a module belongs to: `spade.X` (a top-level module is its
  own)."""
  return ".".join(module.split(".")[:2])


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
  """Folder -> the other folders its modules import (`spade` itself, the
  package's `__init__`, is no folder)."""
  out = {folder(m): set() for m in graph if m != _PACKAGE}
  for module, targets in graph.items():
    if module == _PACKAGE:
      continue
    others = {folder(t) for t in targets if t != _PACKAGE}
    out[folder(module)] |= others - {folder(module)}
  return out


def test_finds_a_cycle_through_a_function_level_import(tmp_path):
  """The walker sees `from pkg import mod` inside a function as an edge."""
  pkg = tmp_path / "pkg"
  pkg.mkdir()
  (pkg / "__init__.py").write_text("")
  (pkg / "a.py").write_text("from pkg import b\n")
  (pkg / "b.py").write_text("def f():\n  from pkg import a\n  return a\n")
  (pkg / "c.py").write_text("from pkg.a import thing\n")
  known = {"pkg", "pkg.a", "pkg.b", "pkg.c"}
  graph = {
      name: _imports(name, pkg / f"{name.split('.')[-1]}.py", known)
      for name in ("pkg.a", "pkg.b", "pkg.c")
  }
  graph["pkg"] = set()
  assert graph["pkg.a"] == {"pkg.b"}
  assert graph["pkg.b"] == {"pkg.a"}
  assert graph["pkg.c"] == {"pkg.a"}
  assert find_cycles(graph) == [["pkg.a", "pkg.b", "pkg.a"]]


def test_no_import_cycles():
  """No module of spade/ reaches itself through imports."""
  graph = import_graph()
  assert len(graph) > 50, "the walk found too few modules"
  cycles = find_cycles(graph)
  if cycles:
    pytest.fail(
        "import cycles in spade/ (function-level imports count):\n"
        + "\n".join("  " + " -> ".join(cycle) for cycle in cycles)
    )


def test_folder_graph_joins_modules_into_folders():
  graph = {
      "spade": set(),
      "spade.a.x": {"spade.b.y", "spade.a.z", "spade"},
      "spade.a.z": set(),
      "spade.b.y": {"spade.main"},
      "spade.main": {"spade.a.z"},
  }
  assert folder_graph(graph) == {
      "spade.a": {"spade.b"},
      "spade.b": {"spade.main"},
      "spade.main": {"spade.a"},
  }
  assert find_cycles(folder_graph(graph)) == [
      ["spade.a", "spade.b", "spade.main", "spade.a"]
  ]


def test_no_folder_cycles():
  """No folder of spade/ reaches itself through its modules' imports."""
  graph = folder_graph(import_graph())
  assert {"spade.selfplay", "spade.sampling", "spade.main"} <= set(graph)
  cycles = find_cycles(graph)
  if cycles:
    pytest.fail(
        "folder cycles in spade/ (function-level imports count):\n"
        + "\n".join("  " + " -> ".join(cycle) for cycle in cycles)
    )


def test_the_iteration_fits_seventy_lines():
  """`iteration`, signature and docstring included, is at most 70 lines."""
  path = _ROOT / _PACKAGE / "selfplay" / "loop.py"
  (fn,) = [
      node
      for node in ast.parse(path.read_text(), str(path)).body
      if isinstance(node, ast.FunctionDef) and node.name == "iteration"
  ]
  lines = fn.end_lineno - fn.lineno + 1
  assert lines <= 70, f"spade/selfplay/loop.py: iteration is {lines} lines"
