"""The house in wings: imports go one way (pipeline -> methods -> engine, every wing -> data), eval reads runs
and never starts one, the import graph has no cycle, the wheel ships every package, and docs/layout.md names
every module."""
import ast
import configparser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# wing -> the parts of debate it may import (itself included)
MAY_IMPORT = {
    "data": {"data"},
    "engine": {"engine", "data"},
    "methods": {"methods", "engine", "data"},
    "pipeline": {"pipeline", "methods", "engine", "data"},
}


def _imports(path, top_level_only=False):
    """(line, dotted module) of every import in `path`; with `top_level_only`, not those inside functions."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, node.module)] + [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return found


def _wing_of(module):
    """debate.X... -> X (None outside the wings: debate itself, debate.api)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "debate" and len(parts) > 1 and parts[1] in MAY_IMPORT else None


def test_no_module_imports_a_wing_above_its_own():
    wrong = []
    for wing, allowed in MAY_IMPORT.items():
        for path in sorted((ROOT / "debate" / wing).rglob("*.py")):
            for line, module in _imports(path):
                if module == "debate.api" or module.startswith("debate.api."):
                    wrong.append(f"{path.relative_to(ROOT)}:{line} imports the API")
                target = _wing_of(module)
                if target is not None and target not in allowed:
                    wrong.append(f"{path.relative_to(ROOT)}:{line} ({wing}) imports {module} ({target})")
    assert not wrong, "\n".join(wrong)


def test_the_data_wing_and_the_scorer_need_no_torch_and_nothing_above_data():
    wrong = []
    for path in sorted((ROOT / "debate" / "data").rglob("*.py")):
        wrong += [f"{path.name}:{line} {m}" for line, m in _imports(path) if m.split(".")[0] in ("torch",
                                                                                                 "transformers")]
    # eval's scoring functions import only the data wing at the top (its command lines' parser is the data wing's).
    for path in sorted((ROOT / "eval").glob("*.py")):
        for line, module in _imports(path, top_level_only=True):
            if module.split(".")[0] in ("torch", "transformers") or _wing_of(module) not in (None, "data") or (
                    module.startswith("debate") and _wing_of(module) is None and module != "debate"):
                wrong.append(f"eval/{path.name}:{line} {module}")
    assert not wrong, "\n".join(wrong)


def test_the_wheel_lists_every_package():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    listed = {p.strip() for p in cfg["options"]["packages"].split(",")}
    packages = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "debate").rglob("__init__.py")}
    assert packages <= listed, f"not in setup.cfg's packages: {sorted(packages - listed)}"


def test_the_layout_page_names_every_package_and_module():
    # Every wing (debate/, train/, eval/: its modules and the report's script and styles) and both scripts.
    layout = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    missing = []
    files = [p for wing in ("debate", "train", "eval") for p in (ROOT / wing).rglob("*")
             if p.suffix in (".py", ".js", ".css") and "__pycache__" not in p.parts]
    files += [ROOT / "run_debate.py", ROOT / "train_moderator.py"]
    for path in sorted(files):
        rel = path.relative_to(ROOT).as_posix()
        name = rel[: -len("__init__.py")] if path.name == "__init__.py" else rel
        if name not in ("debate/", "train/", "eval/") and f"`{name}`" not in layout:
            missing.append(name)
    assert not missing, f"docs/layout.md does not name: {missing}"


def test_eval_never_imports_the_pipeline():
    # Eval reads runs; the pipeline starts them and calls eval to score them. Not even inside a function may
    # eval reach back (the G-Eval judge's run is debate/pipeline/geval_run.py, not eval's).
    wrong = [f"eval/{path.name}:{line} {module}" for path in sorted((ROOT / "eval").glob("*.py"))
             for line, module in _imports(path) if _wing_of(module) == "pipeline" or module == "debate.api"]
    assert not wrong, "\n".join(wrong)


def _module_name(path):
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph():
    """{module: {modules of ours it imports}} over debate/, eval/, train/ and the two scripts, imports inside
    functions included (a cycle through a late import is a cycle all the same)."""
    paths = [*ROOT.glob("debate/**/*.py"), *ROOT.glob("eval/*.py"), *ROOT.glob("train/*.py"),
             ROOT / "run_debate.py", ROOT / "train_moderator.py"]
    modules = {_module_name(p): p for p in paths}
    graph = {}
    for name, path in modules.items():
        targets = set()
        for _, module in _imports(path):
            if module in modules and module != name:
                targets.add(module)
        graph[name] = targets
    return graph


def _cycle(graph):
    """One cycle of `graph` as a list of nodes (first = last), or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def _packages(graph):
    """The same graph between packages: each wing of debate, eval, train; the rest stay modules."""
    def package(module):
        parts = module.split(".")
        if parts[0] == "debate" and len(parts) > 1 and parts[1] in MAY_IMPORT:
            return "debate." + parts[1]
        return parts[0] if parts[0] in ("eval", "train") else module

    out = {}
    for source, targets in graph.items():
        out.setdefault(package(source), set()).update(package(t) for t in targets if package(t) != package(source))
    return out


def test_the_import_graph_has_no_cycle():
    graph = _import_graph()
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]  # the finder finds one
    assert _cycle(graph) is None, f"modules import each other round: {' -> '.join(_cycle(graph))}"
    packages = _packages(graph)
    assert _cycle(packages) is None, f"packages import each other round: {' -> '.join(_cycle(packages))}"
