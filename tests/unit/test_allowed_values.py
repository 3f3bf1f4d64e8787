"""No allowed-value set and no bound is defined in two modules (issue 53): one module owns each set of allowed
strings (a module-level tuple or set such as ``WEIGHTINGS``, ``BATCH_ORDERS``, ``EXTRACTIONS``; a
``Literal[...]``; a ``one_of((...))`` field; a ``not in (...)`` check) and each named bound (``SEED_MAX``,
``DIRICHLET_BETA_MIN``, ...), and the others import it, so a new choice or a moved bound is changed once."""
import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "pflkit"

#: the same strings for two ideas (not one set written twice)
COINCIDENT = {
    frozenset({"max", "min"}): "headline's reduce of a glob's matches; charles_nn's better-is (max accuracy, min loss)",
}


def _strings(node) -> frozenset[str] | None:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) >= 2 and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
        return frozenset(e.value for e in node.elts)
    return None


def allowed_sets(text: str) -> list[tuple[frozenset[str], int, str]]:
    """(the set, line, how it is written) for every allowed-value set in a module's source."""
    tree, out = ast.parse(text), []
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            value = node.value.args[0] if isinstance(node.value, ast.Call) and node.value.args else node.value
            if isinstance(target, ast.Name) and (s := _strings(value)):
                out.append((s, node.lineno, target.id))
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == "Literal" and (
                s := _strings(node.slice)):
            out.append((s, node.lineno, "Literal[...]"))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "one_of" and node.args and (
                s := _strings(node.args[0])):
            out.append((s, node.lineno, "one_of(...)"))
        elif isinstance(node, ast.Compare) and any(isinstance(op, ast.NotIn) for op in node.ops):
            out += [(s, node.lineno, "not in (...)") for c in node.comparators if (s := _strings(c))]
    return out


def duplicates(files: dict[str, str]) -> dict[frozenset[str], dict[str, list[str]]]:
    """The sets defined in more than one module: set -> module -> where."""
    where: dict[frozenset[str], dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for name, text in files.items():
        for s, line, how in allowed_sets(text):
            where[s][name].append(f"{line} {how}")
    return {s: dict(mods) for s, mods in where.items() if len(mods) > 1 and s not in COINCIDENT}


def _sources() -> dict[str, str]:
    return {str(p.relative_to(SRC)): p.read_text() for p in sorted(SRC.rglob("*.py"))}


def test_the_collector_finds_each_way_a_set_is_written():
    """Table: each way of writing a set, twice in two modules, is a duplicate; once, or once imported, is not."""
    cases = [
        ('X = ("a", "b")', 'Y = frozenset({"b", "a"})', True),
        ('X = ("a", "b")', 'def f(v: Literal["a", "b"]): ...', True),
        ('X = ("a", "b")', 'F = one_of(("a", "b"))', True),
        ('X = ("a", "b")', 'def f(v):\n    if v not in ("a", "b"):\n        raise ValueError(v)', True),
        ('X = ("a", "b")', 'from m import X\nY = X', False),
        ('X = ("a", "b")', 'Y = ("a", "b", "c")', False),
    ]
    for one, two, dup in cases:
        assert bool(duplicates({"m.py": one, "n.py": two})) is dup, (one, two)


def test_no_allowed_value_set_is_defined_in_two_modules():
    found = duplicates(_sources())
    assert not found, "\n".join(f"{sorted(s)}: " + "; ".join(f"{m}:{w}" for m, w in mods.items())
                              for s, mods in found.items())


# ---------------------------------------------------------------------------------------------- bounds
#: the name of a module-level bound (SEED_MAX, DIRICHLET_BETA_MIN, ECHO_LIMIT, MEMORY_FLOOR, ...)
BOUND_NAME = re.compile(r"^_?[A-Z][A-Z0-9_]*_(MIN|MAX|LIMIT|FLOOR)(_[A-Z0-9_]+)?$|^_?[A-Z][A-Z0-9_]*_(MIN|MAX)_[A-Z]+")
#: values that are bounds of several ideas at once (not one bound written twice)
TRIVIAL = {0, 1, 2, 10}
#: the same number for two ideas
COINCIDENT_BOUNDS = {
    80: "config.KEY_LIMIT (longest key echoed) and checks.ECHO_LIMIT (longest value echoed)",
    600: "config.LINE_LIMIT (longest message line) and figure_config's largest dpi",
}


def _number(node) -> float | None:
    """The value of a numeric literal or of constant arithmetic on literals (2**32 - 1, 768 * 2**20)."""
    try:
        value = eval(compile(ast.Expression(node), "<bound>", "eval"), {"__builtins__": {}})  # literals only
    except Exception:
        return None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _literal_only(node) -> bool:
    return all(isinstance(n, (ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop, ast.expr_context))
               for n in ast.walk(node))


def named_bounds(text: str) -> list[tuple[str, float, int]]:
    """(name, value, line) of every module-level bound constant written as a number."""
    out = []
    for node in ast.parse(text).body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            if isinstance(target, ast.Name) and BOUND_NAME.match(target.id) and _literal_only(node.value) \
                    and (value := _number(node.value)) is not None:
                out.append((target.id, value, node.lineno))
    return out


def bound_literals(text: str) -> list[tuple[float, int]]:
    """(value, line) of every number a module compares with or gives a pydantic Field as a bound (ge, gt, le,
    lt): where a bound written out again would show."""
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Compare):
            out += [(v, node.lineno) for c in [node.left, *node.comparators]
                    if _literal_only(c) and (v := _number(c)) is not None]
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Field":
            out += [(v, node.lineno) for k in node.keywords if k.arg in ("ge", "gt", "le", "lt")
                    and _literal_only(k.value) and (v := _number(k.value)) is not None]
    return out


def bound_duplicates(files: dict[str, str]) -> list[str]:
    """Each bound defined in two modules (by name or by value), or written out as a number in a module other
    than its owner's (which should import it)."""
    owners: dict[float, list[str]] = defaultdict(list)
    names: dict[str, list[str]] = defaultdict(list)
    for module, text in files.items():
        for name, value, line in named_bounds(text):
            owners[value].append(f"{module}:{line} {name}")
            names[name.lstrip("_")].append(module)
    found = [f"{name} defined in {mods}" for name, mods in names.items() if len(set(mods)) > 1]
    found += [f"{value:g} defined as {where}" for value, where in owners.items()
              if len({w.partition(":")[0] for w in where}) > 1 and value not in COINCIDENT_BOUNDS]
    for module, text in files.items():
        for value, line in bound_literals(text):
            mine = [w for w in owners.get(value, []) if w.partition(":")[0] == module]
            if value in owners and value not in TRIVIAL and value not in COINCIDENT_BOUNDS and not mine:
                found.append(f"{module}:{line} writes {value:g}, the bound {owners[value]}")
    return found


def test_the_bound_collector_finds_a_bound_written_twice():
    cases = [
        ("SEED_MAX = 2**32 - 1", "SEED_MAX = 2**32 - 1", True),           # one name, two modules
        ("SEED_MAX = 2**32 - 1", "TOP_MAX = 4294967295", True),           # one value, two names
        ("SEED_MAX = 2**32 - 1", "def f(s):\n    return s <= 2**32 - 1", True),  # written out again
        ("SEED_MAX = 2**32 - 1", "x: int = Field(le=4294967295)", True),
        ("SEED_MAX = 2**32 - 1", "from m import SEED_MAX\ndef f(s):\n    return s <= SEED_MAX", False),
        ("SEED_MAX = 2**32 - 1", "def f(s):\n    return s >= 1", False),  # a trivial number
    ]
    for one, two, dup in cases:
        assert bool(bound_duplicates({"m.py": one, "n.py": two})) is dup, (one, two)


def test_no_bound_is_defined_in_two_modules():
    found = bound_duplicates(_sources())
    assert not found, "\n".join(found)
