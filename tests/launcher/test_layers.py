"""The layers (docs/architecture.md): `launcher` on top composes `app`, `service` and `sd2`; `app` talks to
the service over HTTP only; `service` sits on `sd2`; `sd2` imports none of them.

Read from the source of every module, every `import` statement counted wherever it stands (module level,
inside a function, under `if TYPE_CHECKING:`), so a lazy import cannot hide an upward dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("launcher", "app", "service", "sd2")
# package → the project packages it may import (besides itself)
ALLOWED = {
    "launcher": {"app", "service", "sd2"},
    "app": set(),
    "service": {"sd2"},
    "sd2": set(),
}


def _imported_packages(path: Path, package: str) -> dict[str, int]:
    """Project packages that the module at `path` imports → the first line that does."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [package] if node.level else [node.module or ""]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top in PACKAGES:
                found.setdefault(top, node.lineno)
    return found


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _graph() -> dict[str, set[str]]:
    return {
        package: {top for path in _modules(package) for top in _imported_packages(path, package)} - {package}
        for package in PACKAGES
    }


@pytest.mark.parametrize("package", PACKAGES)
def test_every_module_imports_only_the_layers_below_it(package):
    modules = _modules(package)
    assert len(modules) > 1, f"no modules found under {ROOT / package}"
    violations = [
        f"{path.relative_to(ROOT)}:{line} imports {top}"
        for path in modules
        for top, line in _imported_packages(path, package).items()
        if top != package and top not in ALLOWED[package]
    ]
    assert not violations, "\n".join(violations)


def test_the_package_graph_has_no_cycle_and_the_launcher_alone_composes():
    graph = _graph()
    assert graph["launcher"] == {"app", "service", "sd2"}  # the launcher really is the composition
    assert not any(package in targets for package, targets in graph.items() if package != "launcher")
    order, seen = [], set()

    def visit(package: str, path: tuple[str, ...]) -> None:
        assert package not in path, f"import cycle: {' → '.join((*path, package))}"
        if package in seen:
            return
        for target in sorted(graph[package]):
            visit(target, (*path, package))
        seen.add(package)
        order.append(package)

    for package in PACKAGES:
        visit(package, ())
    assert order.index("sd2") < order.index("service") < order.index("launcher")


def test_the_checker_sees_lazy_and_relative_imports(tmp_path):
    """Negative control: an import inside a function and a relative import are both found."""
    module = tmp_path / "m.py"
    module.write_text(
        "from . import sibling\ndef f():\n    from service.app import create_app\n    import app.mount\n"
    )
    assert _imported_packages(module, "sd2") == {"sd2": 1, "service": 3, "app": 4}


# The Engine's models and registries: sd2 works with them, the layers above go through its methods.
ENGINE_INTERNALS = {"drafters", "verifier", "tokenizer", "placement", "add_drafter", "stop_ids"}


def _engine_internals_used(path: Path) -> list[tuple[int, str]]:
    """(line, attribute) wherever `<…engine>.<internal>` is read, `engine` being any name or attribute
    spelled so (`engine.verifier`, `services.host.engine.drafters`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Attribute) and node.attr in ENGINE_INTERNALS:
            owner = node.value
            name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", None)
            if name == "engine":
                found.append((node.lineno, node.attr))
    return found


@pytest.mark.parametrize("package", ("launcher", "app", "service"))
def test_the_layers_above_sd2_never_look_behind_the_engine(package):
    """The Engine is a facade: `prepare`, `stream`, `drafter`, `load_drafter`… (docs/architecture.md)."""
    violations = [
        f"{path.relative_to(ROOT)}:{line} reads engine.{attr}"
        for path in _modules(package)
        for line, attr in _engine_internals_used(path)
    ]
    assert not violations, "\n".join(violations)


def test_the_facade_checker_sees_a_reach_through_an_attribute_chain(tmp_path):
    """Negative control: both spellings are found; a method call on the facade is not."""
    module = tmp_path / "m.py"
    module.write_text("a = engine.verifier\nb = services.host.engine.drafters\nc = engine.drafter('x')\n")
    assert _engine_internals_used(module) == [(1, "verifier"), (2, "drafters")]


# the command-line modules of sd2: they may import the engine, never the other way round
CLI_MODULES = {
    "sd2.cli",
    "sd2.cli_args",
    "sd2.__main__",
    "sd2.bench.command",
    "sd2.data.cli",
    "sd2.train.cli",
}


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return names


def test_no_engine_module_imports_a_command_line_module():
    """The CLI's choices live in the torch-free sd2.choices, so the engine's modules need no CLI module
    (this was once a circle: sd2.devices and sd2.draft_step → sd2.cli_args → sd2.engine)."""
    assert {_module_name(path) for path in _modules("sd2")} >= CLI_MODULES  # the list is not stale
    violations = [
        f"{_module_name(path)} imports {sorted(_imported_modules(path) & CLI_MODULES)}"
        for path in _modules("sd2")
        if _module_name(path) not in CLI_MODULES and _imported_modules(path) & CLI_MODULES
    ]
    assert not violations
