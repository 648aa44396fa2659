"""The run machine is composed, not mixed in: each attribute has one writer (issue 10).

Read from the source (an AST scan of `actors/_machine/`), so a change that breaks the rule
fails here whatever the tests exercise:

- no class of the package derives from another of its classes (no mixins);
- every attribute assignment (`x.a = ...`, `x.a += ...`) writes `self.<attr>` inside a method
  of the class that declares it, except the calls of a plan, which only `PlanState` changes;
- no module reaches into another object's private attributes (`obj._x` with `obj` not `self`);
- the count of running calls is kept by `PlanState`'s status moves only;
- every module stays under 600 lines, and the host writes no private attribute of a machine.
"""

from __future__ import annotations

import ast
from pathlib import Path

from steerable.actors import _machine
from steerable.actors._machine.base import Call
from steerable.actors._machine.plan import PlanState
from steerable.protocol import RunConfig
from tests.machine_kit import Run, call, plan

PACKAGE = Path(_machine.__file__).parent
ACTORS = PACKAGE.parent
RECORD_OWNERS = {"Call": "PlanState"}
"""Records whose attributes another class changes once they are built: record -> its writer."""


def _modules() -> dict[str, ast.Module]:
    return {
        path.name: ast.parse(path.read_text(encoding="utf-8"), str(path))
        for path in sorted(PACKAGE.glob("*.py"))
    }


def _classes() -> dict[str, tuple[str, ast.ClassDef]]:
    return {
        node.name: (name, node)
        for name, tree in _modules().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    }


def _targets(node: ast.AST) -> list[ast.Attribute]:
    """The attributes an assignment statement writes."""
    if isinstance(node, ast.Assign):
        raw: list[ast.expr] = list(node.targets)
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        raw = [node.target]
    else:
        return []
    out: list[ast.Attribute] = []
    while raw:
        target = raw.pop()
        if isinstance(target, ast.Tuple | ast.List):
            raw.extend(target.elts)
        elif isinstance(target, ast.Attribute):
            out.append(target)
    return out


def _writes() -> list[tuple[str, str | None, str, str, int]]:
    """(module, enclosing class, written-through name, attribute, line) of every write."""
    found: list[tuple[str, str | None, str, str, int]] = []
    for module, tree in _modules().items():
        owner_of: dict[ast.AST, str | None] = {}

        def visit(node: ast.AST, owner: str | None, tree_owner: dict[ast.AST, str | None]) -> None:
            tree_owner[node] = owner
            for child in ast.iter_child_nodes(node):
                visit(child, node.name if isinstance(node, ast.ClassDef) else owner, tree_owner)

        visit(tree, None, owner_of)
        for node, owner in owner_of.items():
            for target in _targets(node):
                base = ast.unparse(target.value)
                found.append((module, owner, base, target.attr, target.lineno))
    return found


def test_no_class_of_the_machine_is_a_mixin() -> None:
    classes = _classes()
    mixed = {
        name: [ast.unparse(b) for b in node.bases if ast.unparse(b) in classes]
        for name, (_, node) in classes.items()
    }
    assert {k: v for k, v in mixed.items() if v} == {}


def test_each_attribute_is_written_by_its_own_class_only() -> None:
    wrong = []
    for module, owner, base, attr, line in _writes():
        if base == "self" and owner is not None:
            continue  # a class writing its own attribute
        record = next(
            (r for r, w in RECORD_OWNERS.items() if owner == w and attr in _slots(r)), None
        )
        if record is not None:
            continue  # PlanState changing a call of its plan
        wrong.append(f"{module}:{line}: {owner}: {base}.{attr} =")
    assert wrong == []


def _slots(record: str) -> tuple[str, ...]:
    assert record == "Call"
    return Call.__slots__


def test_no_module_reaches_into_another_objects_private_attributes() -> None:
    wrong = []
    for module, tree in _modules().items():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not (node.attr.endswith("_") and len(node.attr) > 2)  # an Enum's `_value_`
                and not (isinstance(node.value, ast.Name) and node.value.id in {"self", "cls"})
            ):
                wrong.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
    assert wrong == []


def test_the_running_count_is_derived_from_status_moves_only() -> None:
    """`running` is written only in `PlanState` (install, clear and `_move`), never scanned
    per step."""
    writers = {
        (owner, line)
        for module, owner, base, attr, line in _writes()
        if attr in {"running", "status"}
    }
    assert {owner for owner, _ in writers} == {"PlanState", "Call"}
    tree = _modules()["plan.py"]
    methods = {
        fn.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and node.name == "PlanState"
        for fn in node.body
        if isinstance(fn, ast.FunctionDef)
        for sub in ast.walk(fn)
        for target in _targets(sub)
        if target.attr in {"running", "status"}
    }
    assert methods == {"__init__", "install", "clear", "_move"}


def test_the_running_count_follows_the_calls() -> None:
    """Behaviour, not just shape: after every step the count equals the RUNNING calls."""
    run = Run(config=RunConfig(max_parallel_tools=2)).start()
    run.decide_next(plan(*(call("read", q=i) for i in range(5))))
    state: PlanState = run.machine._exec._plan
    seen = []
    while run.fx.running:
        assert state.running == sum(c.status.value == "running" for c in state.calls)
        assert state.pending == sum(c.status.value == "pending" for c in state.calls)
        seen.append(state.running)
        run.report(next(iter(run.fx.running)), value="ok")
    assert state.running == state.pending == 0
    assert seen == [2, 2, 2, 2, 1]


def test_modules_stay_under_600_lines() -> None:
    sizes = {p.name: len(p.read_text(encoding="utf-8").splitlines()) for p in PACKAGE.glob("*.py")}
    assert {k: v for k, v in sizes.items() if v >= 600} == {}


def test_the_host_writes_no_private_attribute_of_a_machine() -> None:
    wrong = []
    for path in ACTORS.rglob("*.py"):
        if PACKAGE in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for target in _targets(node):
                base = ast.unparse(target.value)
                if "machine" in base and target.attr.startswith("_"):
                    wrong.append(f"{path.name}:{target.lineno}: {base}.{target.attr}")
    assert wrong == []
