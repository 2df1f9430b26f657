"""BUILD mirrors the package: every module and test has a Bazel target."""

import glob
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _targets():
  """Evaluates BUILD (Starlark is Python syntax) with recording rules."""
  rules = {"py_library": [], "py_test": [], "py_binary": []}

  def make(kind):
    def rule(name, srcs=(), deps=(), **kwargs):
      del kwargs
      rules[kind].append({"name": name, "srcs": list(srcs), "deps": list(deps)})

    return rule

  env = {kind: make(kind) for kind in rules}
  env["glob"] = lambda *a, **k: []  # globs would hide a missing module
  env["load"] = lambda *a, **k: None
  env["package"] = lambda **k: None
  with open(os.path.join(ROOT, "BUILD")) as f:
    exec(compile(f.read(), "BUILD", "exec"), env)  # pylint: disable=exec-used
  return rules


def test_every_module_has_a_library_target():
  rules = _targets()
  covered = {
      s for kind in ("py_library", "py_binary") for r in rules[kind]
      for s in r["srcs"]
  }
  modules = {
      os.path.relpath(p, ROOT)
      for p in glob.glob(os.path.join(ROOT, "spade", "**", "*.py"),
                         recursive=True)
  }
  missing = sorted(modules - covered)
  assert not missing, f"add these to a py_library in BUILD: {missing}"
  stale = sorted(
      s for s in covered if s.startswith("spade/")
      and not os.path.exists(os.path.join(ROOT, s))
  )
  assert not stale, f"BUILD names files that do not exist: {stale}"


def test_every_test_has_a_test_target():
  rules = _targets()
  covered = {s for r in rules["py_test"] for s in r["srcs"]}
  tests = {
      os.path.relpath(p, ROOT)
      for p in glob.glob(os.path.join(ROOT, "tests", "**", "test_*.py"),
                         recursive=True)
  }
  missing = sorted(tests - covered)
  assert not missing, f"add these as py_test targets in BUILD: {missing}"


def test_deps_name_existing_targets():
  rules = _targets()
  names = {r["name"] for kind in rules.values() for r in kind}
  for kind in rules.values():
    for r in kind:
      for dep in r["deps"]:
        if dep.startswith(":"):
          assert dep[1:] in names, f"{r['name']} depends on unknown {dep}"
