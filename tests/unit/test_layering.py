"""The architecture as a test: each part of the package and the parts it never imports
(docs/design.md, "Parts"), and no import circles between modules. Imports are read from
the source (every `import`, at any depth, type-checking ones included), so a lazy import
inside a function counts as much as one at the top."""

from __future__ import annotations

import ast
from pathlib import Path

import trirace

ROOT = Path(trirace.__file__).parent

# Part -> the modules it holds (a name covers its submodules).
PARTS = {
    "base": ("trirace.errors", "trirace.yamlfile", "trirace.saved", "trirace.preflight"),
    "models": ("trirace.models", "trirace.optim"),
    "config": ("trirace.config",),
    "plan": ("trirace.plan",),
    "policy": ("trirace.policy",),
    "data": ("trirace.data",),
    "obs": ("trirace.obs",),
    "runtime": ("trirace.runtime",),
    "sim": ("trirace.sim",),
    "testbed": ("trirace.testbed",),
    "calibrate": ("trirace.calibrate",),
    "bench": ("trirace.bench",),
    "cli": ("trirace.cli", "trirace.__main__", "trirace.generate"),
    "api": ("trirace",),  # the package's own __init__: what `import trirace` offers
}
_ABOVE_ALL = {"cli", "api"}
# Part -> the parts it never imports. Planning and policies are pure and shared by both
# executors; the executors (runtime, sim) never import each other; instruments (testbed,
# calibrate, bench) sit above what they measure; nothing below the CLI imports it.
NEVER = {
    "base": set(PARTS) - {"base"},
    "models": set(PARTS) - {"base", "models"},
    "config": {"policy", "data", "obs", "runtime", "sim", "testbed", "calibrate", "bench"} | _ABOVE_ALL,
    "plan": {"data", "obs", "runtime", "sim", "testbed", "calibrate", "bench"} | _ABOVE_ALL,
    "policy": {"config", "data", "obs", "runtime", "sim", "testbed", "calibrate", "bench"} | _ABOVE_ALL,
    "data": {"plan", "policy", "obs", "runtime", "sim", "testbed", "calibrate", "bench"} | _ABOVE_ALL,
    "obs": {"policy", "runtime", "sim", "testbed", "calibrate", "bench"} | _ABOVE_ALL,
    "runtime": {"sim", "testbed", "calibrate", "bench"} | _ABOVE_ALL,
    "sim": {"runtime", "data", "testbed", "calibrate", "bench"} | _ABOVE_ALL,
    "testbed": {"models", "config", "policy", "data", "obs", "runtime", "sim", "calibrate", "bench"} | _ABOVE_ALL,
    "calibrate": {"bench"} | _ABOVE_ALL,
    "bench": _ABOVE_ALL,
    "cli": {"api"},
    "api": {"cli"},
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The trirace modules `name` imports, resolved to modules (not to names in them)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:  # `from pkg import module` imports the module
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in modules else target)
    return {m for m in found if m in modules and m != name}


def _part(module: str) -> str:
    best = max((prefix for prefixes in PARTS.values() for prefix in prefixes
                if module == prefix or module.startswith(prefix + ".")), key=len)
    return next(part for part, prefixes in PARTS.items() if best in prefixes)


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_every_module_belongs_to_a_part_with_rules():
    assert set(NEVER) == set(PARTS)
    for module in _graph():
        assert _part(module) in NEVER, module


def test_no_part_imports_one_it_must_never_import():
    broken = sorted(f"{m} ({_part(m)}) imports {i} ({_part(i)})"
                    for m, imports in _graph().items() for i in imports if _part(i) in NEVER[_part(m)])
    assert not broken, "\n".join(broken)


def test_no_import_circles():
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        path.append(module)
        for nxt in sorted(graph[module]):
            if state.get(nxt) == 1:
                circles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, path)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    assert not circles, "\n".join(circles)


def test_the_checker_sees_a_planted_violation_and_circle(tmp_path):
    """The rules are only as good as the reading of imports: a lazy import in a function
    and a relative one both count."""
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("def f():\n    from ..runtime import trainer\n")
    b.write_text("from . import a\n")
    modules = {"trirace.plan.a": a, "trirace.plan.b": b, "trirace.runtime.trainer": a}
    assert _imports("trirace.plan.a", a, modules) == {"trirace.runtime.trainer"}
    assert _imports("trirace.plan.b", b, modules) == {"trirace.plan.a"}
    assert "runtime" in NEVER[_part("trirace.plan.a")]
