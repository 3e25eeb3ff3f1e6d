"""The house's boundaries: imports only point downward, between the packages (router -> policies -> d3backend) and
between the rooms of `router/` (the order below, written down once here; docs/architecture.md explains it)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FORBIDDEN = {"d3backend": {"policies", "router"}, "policies": {"router"}, "router": set()}

# The rooms of router/, lowest first: a module may import from its own room and from the rooms before it, never from
# one after it. `router/__init__.py` (the public names) and `router/__main__.py` stand above them all.
ROOMS = (
    "_errors",  # what a request can end in besides an answer
    "_asgi",  # ASGI plumbing: headers, bodies, relaying
    "_observe",  # metrics, traces, logs
    "_apis",  # one adapter per client API, the decision state they read bodies into, the registry
    "_translate",  # carrying a request of one API to an upstream of another, and its answers back
    "_decision",  # the decision: service, record, deadline, shadows, engines
    "_sessions",  # sessions and their stores
    "_faces",  # the proxy and the middleware
    "_offline",  # replay, calibrate, reports
    "_cli",  # the d3router command
)


def imported_packages(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def router_imports(path: Path) -> set[str]:
    """The router modules `path` imports, wherever the import stands (a function's own imports count too):
    `from router._x.y import z` -> router._x.y, `from router._x import y` -> router._x.y when y is a module."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "router")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "router":
            assert node.level == 0, f"{path}: relative import"
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                is_module = (REPO / Path(*candidate.split("."))).with_suffix(".py").exists() or (
                    REPO / Path(*candidate.split(".")) / "__init__.py"
                ).exists()
                found.add(candidate if is_module else node.module)
    return found


def room_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ROOMS else None


ROUTER_FILES = sorted((REPO / "router").rglob("*.py"))


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_downward(package: str) -> None:
    offenders = {
        str(path.relative_to(REPO)): sorted(imported_packages(path) & FORBIDDEN[package])
        for path in (REPO / package).rglob("*.py")
    }
    assert {file: bad for file, bad in offenders.items() if bad} == {}


def test_vllm_is_imported_in_one_adapter_only() -> None:
    importers = sorted(
        str(path.relative_to(REPO))
        for package in FORBIDDEN
        for path in (REPO / package).rglob("*.py")
        if "vllm" in imported_packages(path)
    )
    assert importers in ([], ["d3backend/_vllm.py"])


def test_every_router_module_lives_in_a_room() -> None:
    loose = [
        module_name(path)
        for path in ROUTER_FILES
        if room_of(module_name(path)) is None and module_name(path) not in {"router", "router.__main__"}
    ]
    assert loose == [], "a module of router/ outside the rooms: add it to a room (tests/test_layout.py's ROOMS)"
    assert sorted(p.name for p in (REPO / "router").iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(
        room for room in ROOMS if (REPO / "router" / room).is_dir()
    )


def test_rooms_import_only_downward() -> None:
    offenders = []
    for path in ROUTER_FILES:
        here = room_of(module_name(path))
        if here is None:
            continue  # router/__init__.py and __main__.py stand above every room
        for target in router_imports(path):
            there = room_of(target)
            if there is None:
                offenders.append(f"{module_name(path)} imports {target} (the package's face, above every room)")
            elif ROOMS.index(there) > ROOMS.index(here):
                offenders.append(f"{module_name(path)} ({here}) imports {target} ({there}), a room above it")
    assert offenders == []


def test_no_import_cycle_between_modules() -> None:
    graph = {module_name(path): router_imports(path) for path in ROUTER_FILES}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the walk's path, 2: done

    def walk(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph.get(module, set())):
            if target == module or target not in graph or room_of(target) is None:
                continue
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif state.get(target) is None:
                walk(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if state.get(module) is None and room_of(module) is not None:
            walk(module, [module])
    assert cycles == []


def test_the_layering_check_sees_an_upward_import(tmp_path: Path) -> None:
    """The check itself: a module of a lower room importing a higher one is found (the parser, not the tree)."""
    source = tmp_path / "probe.py"
    source.write_text("def f():\n    from router._faces.proxy import ProxyApp\n", encoding="utf-8")
    assert router_imports(source) == {"router._faces.proxy"}
    assert ROOMS.index(room_of("router._faces.proxy") or "") > ROOMS.index("_apis")


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_assert_on_runtime_paths(package: str) -> None:
    """`python -O` removes asserts: a check the code relies on is an `if` that raises."""
    found = [
        f"{path.relative_to(REPO)}:{node.lineno}"
        for path in (REPO / package).rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Assert)
    ]
    assert found == []
