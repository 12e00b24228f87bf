"""The package's floors (docs/architecture.md#dependencies): no import goes up, no circle.

Every import of an agenttasks module by another is read from the source (at module level and
inside functions; those under `if TYPE_CHECKING:` are for type checkers only and do not count).
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "agenttasks"

# From the ground up: a module may import its own floor and the floors below.
FLOORS = [
    # the vocabulary, and compat/ (which imports nothing of agenttasks)
    [
        "agenttasks",
        "conf",
        "ids",
        "states",
        "text",
        "types",
        "exceptions",
        "signals",
        "tools",
        "tracing",
        "registry",
        "compat",
    ],
    ["models"],
    ["broker"],
    ["sql", "store"],
    ["operations"],
    ["flow"],
    ["delivery"],
    ["lifecycle"],
    ["runtime"],
    ["toolkit"],
    ["execution"],
    ["api", "a2a", "mcp", "langgraph", "admin"],  # the surfaces, side by side
    ["urls", "apps", "checks", "management", "migrations", "templatetags"],  # the doors
]
SURFACES = {"api", "a2a", "mcp", "langgraph", "admin"}
# The two places one surface reads another's (docs/architecture.md#dependencies).
ACROSS_SURFACES = {
    ("agenttasks.a2a.mapping", "agenttasks.api.serializers"),  # A2A carries REST's action shape
    ("agenttasks.admin.live", "agenttasks.api.streams"),  # the live page follows REST's stream
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def room(module: str) -> str:
    """The top-level part of agenttasks a module lives in ("agenttasks" for the package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "agenttasks"


def floor(module: str) -> int:
    return next(i for i, rooms in enumerate(FLOORS) if room(module) in rooms)


def type_checking_only(tree: ast.Module) -> set[int]:
    """The ids of the import nodes under `if TYPE_CHECKING:`."""
    hidden = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            hidden |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return hidden


def imports(module: str, *, top_level_only: bool = False) -> set[str]:
    """The agenttasks modules `module` imports (a submodule when it names one)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    hidden = type_checking_only(tree)
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = set()
    for node in nodes:
        if id(node) in hidden:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            names = [
                f"{source}.{a.name}" if f"{source}.{a.name}" in MODULES else source
                for a in node.names
            ]
        else:
            continue
        found |= {name for name in names if name in MODULES and name != module}
    return found


def test_every_module_stands_on_a_floor():
    assert [m for m in MODULES if not any(room(m) in rooms for rooms in FLOORS)] == []


def test_no_import_goes_up_a_floor():
    upward = [
        f"{importer} -> {imported}"
        for importer in MODULES
        for imported in imports(importer)
        if floor(imported) > floor(importer)
    ]
    assert upward == []


def test_the_surfaces_stand_side_by_side():
    across = [
        (importer, imported)
        for importer in MODULES
        if room(importer) in SURFACES
        for imported in imports(importer)
        if room(imported) in SURFACES and room(imported) != room(importer)
    ]
    assert set(across) <= ACROSS_SURFACES, set(across) - ACROSS_SURFACES


def test_compat_imports_nothing_of_agenttasks():
    assert {m: imports(m) for m in MODULES if room(m) == "compat" and imports(m)} == {}


def test_no_circle_of_imports():
    graph = {m: imports(m, top_level_only=True) for m in MODULES}
    circles = []
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for imported in sorted(graph[module]):
            if state.get(imported) == "open":
                circles.append([*path[path.index(imported) :], imported])
            elif imported not in state:
                visit(imported, [*path, imported])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert circles == []


def writes_deleting_at(tree: ast.AST) -> bool:
    """Whether a module names a conversation's delete mark in a call (`update(deleting_at=…)`)
    or assigns it (`conversation.deleting_at = …`)."""
    return any(
        (isinstance(node, ast.keyword) and node.arg == "deleting_at")
        or (
            isinstance(node, ast.Attribute)
            and node.attr == "deleting_at"
            and isinstance(node.ctx, ast.Store)
        )
        for node in ast.walk(tree)
    )


def test_only_the_store_writes_the_delete_mark():
    writers = {
        module
        for module, path in MODULES.items()
        if writes_deleting_at(ast.parse(path.read_text(encoding="utf-8")))
    }
    assert writers and all(room(m) in {"store", "migrations"} for m in writers), writers
