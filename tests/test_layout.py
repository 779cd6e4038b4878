"""The tree says where code runs, and a test holds it to that: host programs are stdlib-only and never import
controller or model code; the model has no pyinfra; no import cycles among specops' modules; no module grows past
the size its concern earns."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from operations.controller import remote

PKG = Path(__file__).resolve().parent.parent / "operations"
MAX_LINES = 320
# the only third-party imports a host program may make, lazily, where the host has them
OPTIONAL_ON_HOST = {"probe_gpu.py": {"pynvml"}, "engine_check.py": {"sglang"}}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _is_module(name: str) -> bool:
    path = PKG.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports(path: Path, package: str | None = None) -> list[tuple[str, int, bool]]:
    """(absolute module name, line, at module level) of every import in ``path`` (a module of ``package``,
    default: where it lies under operations/), relative ones resolved."""
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    if package is None:
        package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module
            subs = [f"{mod}.{a.name}" for a in node.names]
            if not all(_is_module(sub) for sub in subs):  # ``from PKG import sub`` names sub, not PKG's contents
                out.append((mod, node.lineno, id(node) in top))
            out += [(sub, node.lineno, id(node) in top) for sub in subs]
    return out


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts}


def _host_program_problems(path: Path) -> list[str]:
    siblings = {_module_name(p) for p in (PKG / "remote").glob("*.py")} | {"operations.remote"}
    allowed = OPTIONAL_ON_HOST.get(path.name, set())
    bad = []
    for mod, line, at_top in _imports(path, "operations.remote"):
        root = mod.split(".")[0]
        if mod.startswith("operations."):
            if mod.rpartition(".")[0] == "operations.remote" and mod not in siblings:
                continue  # ``from .common import name``: the name, not a module
            if mod not in siblings and not mod.startswith(tuple(s + "." for s in siblings)):
                bad.append(f"line {line}: {mod} (controller/model code; host programs run without it)")
        elif root in sys.stdlib_module_names:
            continue
        elif root in allowed and not at_top:
            continue  # imported where used, so the program runs on a host without it
        else:
            bad.append(f"line {line}: {mod} (not stdlib{'; import it lazily' if root in allowed else ''})")
    return bad


@pytest.mark.parametrize("path", sorted((PKG / "remote").glob("*.py")), ids=lambda p: p.name)
def test_host_programs_import_only_the_stdlib_and_each_other(path):
    bad = _host_program_problems(path)
    assert not bad, f"{path.name}:\n" + "\n".join(bad)


def test_the_bundle_installs_and_imports_in_an_interpreter_without_site_packages(tmp_path):
    """What a host receives, installed by the real installer and imported as the host would, by an interpreter
    that sees no site-packages at all (``python -I -S``)."""
    digest, payload = remote.bundle()
    home = tmp_path / "cache"
    home.mkdir(mode=0o700)
    target = home / digest
    isolated = [sys.executable, "-I", "-S"]
    subprocess.run([*isolated, "-c", remote.INSTALLER, str(target), payload], check=True)
    names = sorted(p.name for p in (target / remote.PACKAGE).iterdir())
    assert names == sorted(p.name for p in (PKG / "remote").glob("*.py")), names
    for name in names:
        mod = f"{remote.PACKAGE}.{name.removesuffix('.py')}"
        proc = subprocess.run([*isolated, "-c", f"import sys; sys.path.insert(0, sys.argv[1]); import {mod}",
                               str(target)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{mod}: {proc.stderr}"


def test_the_model_has_no_pyinfra_and_no_controller():
    bad = [f"{p.relative_to(PKG)}:{line}: {mod}"
           for p in (PKG / "model").rglob("*.py")
           for mod, line, _ in _imports(p)
           if mod.split(".")[0] in ("pyinfra", "gevent")
           or mod.startswith(("operations.controller", "operations.facts", "operations.reporting",
                              "operations.gpu", "operations.server", "operations.multinode", "operations.sweep"))]
    assert not bad, "\n".join(bad)


def _cycles(graph: dict[str, list[str]]) -> list[str]:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    found = []

    def visit(node, stack):
        state[node] = 1
        for nxt in graph.get(node, ()):
            if state.get(nxt) == 1:
                found.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return found


def test_no_import_cycles():
    modules = _modules()
    graph = {name: sorted({m for m, _, _ in _imports(path) if m in modules and m != name})
             for name, path in modules.items()}
    assert graph["operations.model.validation"], "the import reader found no edges"
    assert _cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == ["a -> b -> c -> a"]
    cycles = _cycles(graph)
    assert not cycles, "\n".join(cycles)


def test_no_module_outgrows_its_concern():
    long = {str(p.relative_to(PKG)): n for p in PKG.rglob("*.py") if "__pycache__" not in p.parts
            and (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split by concern): {long}"


def test_a_host_program_that_imported_controller_code_is_caught(tmp_path):
    """The import reader itself: a planted ``from operations.controller import remote`` and a top-level
    third-party import are both reported; a sibling import is not."""
    planted = tmp_path / "planted.py"
    planted.write_text("import yaml\nfrom operations.controller import remote\nfrom .common import masked\n"
                       "from .. import model\n")
    bad = "\n".join(_host_program_problems(planted))
    assert "operations.controller" in bad and "yaml" in bad and "operations.model" in bad, bad
    assert "common" not in bad


def _readme_section(title: str) -> str:
    text = (PKG.parent / "README.md").read_text()
    return text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_readme_public_api_is_what_init_declares():
    import importlib
    import re

    import operations

    rows = [line for line in _readme_section("Public API").splitlines() if line.startswith("| `operations.")]
    named = {re.match(r"\| `operations\.(\w+)`", row).group(1): row for row in rows}
    assert set(named) == set(operations.__all__), (sorted(named), operations.__all__)
    for module, row in named.items():
        mod = importlib.import_module(f"operations.{module}")
        for call in re.findall(rf"`{module}\.([\w.]+)[(`]", row):  # `gpu.idle(...)`, `facts.gpu.Gpus`
            obj = mod
            for part in call.split("."):
                obj = getattr(obj, part, None) or importlib.import_module(f"{obj.__name__}.{part}")
            assert callable(obj), (module, call)


def test_the_readme_layout_names_paths_that_exist():
    import re

    section = _readme_section("Layout")
    paths = [p for row in section.splitlines() if row.startswith("| `")
             for p in re.findall(r"`([\w./-]+)`", row.split("|")[1])]
    assert "operations/remote/" in paths and "simulator/" in paths, paths
    base = {"gpu.py": "operations", "server.py": "operations", "multinode.py": "operations", "sweep.py": "operations",
            "plan.py": "operations", "errors.py": "operations"}
    missing = [p for p in paths if not (PKG.parent / base.get(p, "") / p).exists()]
    assert not missing, missing
    # every package of operations/ has its row
    for pkg in (p for p in PKG.iterdir() if (p / "__init__.py").exists()):
        assert f"operations/{pkg.name}/" in paths, pkg.name
