"""The house in wings: imports go one way (pipeline -> methods -> engine, every wing -> data), the wheel ships
every package, and the README's layout names every module."""
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
        wrong += [f"{path.name}:{line} {m}" for line, m in _imports(path) if m.split(".")[0] in ("torch", "transformers")]
    # eval's scoring functions import only the data wing; its command lines may borrow the pipeline wing's parser.
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


def test_the_readme_layout_names_every_package_and_module():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    layout = readme[readme.index("## Layout"):]
    missing = []
    for path in sorted((ROOT / "debate").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        name = rel[: -len("__init__.py")] if path.name == "__init__.py" else rel
        if name != "debate/" and f"`{name}`" not in layout:
            missing.append(name)
    assert not missing, f"README's layout does not name: {missing}"
