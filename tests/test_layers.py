"""Import direction: cli → train → runners → sandboxes, recipes a leaf; no torch/peft/vllm below train; wings and
private modules stay behind their folder's public names."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ORDER = ["cli", "train", "runners", "sandboxes"]  # a layer may import those after it, never before
BASE = {"errors", "registry", "config"}  # hrl.errors, hrl.registry, hrl.config: below every layer, nothing above
HEAVY = {"torch", "peft", "vllm", "ray"}


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(module, at_top_level) for every import in a file."""
    tree = ast.parse(path.read_text(), str(path))
    top = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, id(node) in top))
    return out


def _files(layer: str) -> list[Path]:
    return sorted((ROOT / layer).rglob("*.py"))


def _imported_modules(path: Path) -> list[str]:
    """Every module a file imports, `from pkg import name` counted as `pkg.name` too (name may be a module)."""
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    return out


def _module_file(module: str) -> Path | None:
    """The source file of an `hrl.<layer>.…` module in this checkout (None: not one, or a name in a module)."""
    parts = module.split(".")
    if parts[0] != "hrl" or len(parts) < 2:
        return None
    path = _source_dir(parts).joinpath(*parts[1:])
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


def _source_dir(parts: list[str]) -> Path:
    """Where `hrl.<parts[1]>…` lives: a layer's folder at the top (package-dir), the base (errors, config) in hrl/."""
    return ROOT if parts[1] in {*ORDER, "recipes"} else ROOT / "hrl"


def test_every_import_of_hrl_names_a_module_that_exists():
    """A module moved or renamed leaves no import of its old name behind, lazy ones included (they fail only when
    their code path runs)."""
    bad = []
    for folder in [*ORDER, "recipes", "hrl", "tests", "bench", "examples"]:
        for f in _files(folder):
            for node in ast.walk(ast.parse(f.read_text(), str(f))):
                names = [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
                names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
                bad += [f"{f.relative_to(ROOT)} imports {m}" for m in names if m and m.split(".")[0] == "hrl"
                        and m != "hrl" and _module_file(m) is None and _package_file(m) is None]  # fmt: skip
    assert not bad, "\n".join(bad)


def test_layers_import_downwards_only():
    bad = []
    for layer in [*ORDER, "recipes"]:
        allowed = (
            (set(ORDER[ORDER.index(layer) :]) if layer in ORDER else set()) | {"recipes"} | BASE
        )  # recipes: a leaf
        for f in _files(layer):
            for mod, _ in _imports(f):
                parts = mod.split(".")
                if parts[0] == "hrl" and len(parts) > 1 and parts[1] not in allowed:
                    bad.append(f"{f.relative_to(ROOT)} imports {mod}")
    assert not bad, "\n".join(bad)


def test_rollout_side_has_no_top_level_heavy_imports():
    bad = [
        f"{f.relative_to(ROOT)} imports {mod} at module level"
        for layer in ["runners", "sandboxes", "recipes", "cli"]
        for f in _files(layer)
        for mod, top in _imports(f)
        if top and mod.split(".")[0] in HEAVY
    ]
    assert not bad, "\n".join(bad)


def test_only_the_placement_modules_import_ray():
    """Ray is the `ray` extra: `--placement ray` needs it, nothing else may (runners/placement/ray*.py and the
    trainer's ranks as actors, train/ray_group.py, lazily)."""
    bad = [
        f"{f.relative_to(ROOT)} imports {mod}"
        for layer in [*ORDER, "recipes"]
        for f in _files(layer)
        for mod, _ in _imports(f)
        if mod.split(".")[0] == "ray"
        and not f.relative_to(ROOT).match("runners/placement/ray*.py")
        and f.relative_to(ROOT).as_posix() != "train/ray_group.py"
    ]
    assert not bad, "\n".join(bad)


def test_help_and_version_do_not_import_torch():
    code = (
        "import sys\n"
        "sys.argv = ['hrl', '--help']\n"
        "from hrl.cli.main import app\n"
        "try:\n    app(standalone_mode=False)\nexcept SystemExit:\n    pass\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'transformers', 'peft', 'aiohttp'})\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "HEAVY []" in out, out


def test_every_package_is_listed_in_pyproject():
    """Wheel installs only ship the packages pyproject names (the folders are mapped into hrl.* by hand)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        "hrl." + ".".join(p.parent.relative_to(ROOT).parts)
        for layer in [*ORDER, "recipes"]
        for p in (ROOT / layer).rglob("__init__.py")
    } | {"hrl." + ".".join(p.parent.relative_to(ROOT / "hrl").parts) for p in (ROOT / "hrl").glob("*/**/__init__.py")}
    assert found <= listed, f"add to pyproject packages: {sorted(found - listed)}"


@pytest.mark.parametrize("wing", ["tiny", "pretrained"])
def test_the_rl_core_does_not_import_the_model_wings(wing):
    """train/tiny/ (tiny models, the demo's SFT) and train/pretrained/ (`hrl models get`) may use the core; the rest
    of train never uses them (cli may)."""
    bad = [
        f"{f.relative_to(ROOT)} imports {mod}"
        for f in _files("train")
        if ROOT / "train" / wing not in f.parents
        for mod, _ in _imports(f)
        if mod == f"hrl.train.{wing}" or mod.startswith(f"hrl.train.{wing}.")
    ]
    assert not bad, "\n".join(bad)


def test_private_modules_are_imported_only_from_their_own_folder():
    """A module `_x.py` is its folder's business: other folders go through the folder's public modules."""
    bad = []
    for folder in [*ORDER, "recipes", "tests", "bench"]:
        for f in _files(folder):
            for mod in _imported_modules(f):
                target = _module_file(mod)
                private = target is not None and target.stem.startswith("_") and not target.stem.startswith("__")
                if private and target.parent != f.parent:
                    bad.append(f"{f.relative_to(ROOT)} imports the private module {mod}")
    assert not bad, "\n".join(bad)


def test_tests_are_laid_out_like_the_source():
    """The spec of a module sits at its path: tests/runners/proxy/ tests runners/proxy/, and so on."""
    tests = ROOT / "tests"
    misplaced = [
        str(f.relative_to(ROOT))
        for f in tests.rglob("test_*.py")
        if f.parent != tests and not (ROOT / f.parent.relative_to(tests)).is_dir()
    ]
    loose = sorted(f.name for f in tests.glob("test_*.py") if f.name != "test_layers.py")  # repo-wide specs only
    assert not misplaced and not loose, (misplaced, loose)


# What stands a run up (an engine, the proxy, rollouts) lives in runners/placement: cli/ parses, checks and renders.
SERVING_MODULES = (
    "hrl.runners.serving.stack",
    "hrl.runners.serving",
    "hrl.runners.rollouts.episodes",
    "hrl.runners.proxy",
)
SERVING_NAMES = {"serving", "make_rollouts", "run_episodes", "ray_placement", "WorkerPool", "Proxy", "make_engine"}
CLI_MAY_CHECK = {
    "hrl.runners.proxy.toolparsers",
    "hrl.runners.proxy.reasoning",
    "hrl.runners.proxy.toolprompt",
}  # checks before any start


def test_cli_stands_nothing_up_itself():
    bad = []
    for f in _files("cli"):
        tree = ast.parse(f.read_text(), str(f))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or not node.module or node.module in CLI_MAY_CHECK:
                continue
            names = {a.name for a in node.names}
            if node.module.startswith(SERVING_MODULES) or names & SERVING_NAMES:
                bad.append(f"{f.relative_to(ROOT)} imports {sorted(names)} from {node.module}")
    assert not bad, "cli/ stands runs up only through hrl.runners.placement:\n" + "\n".join(bad)


def test_the_base_imports_nothing_of_hrl():
    """hrl.errors, hrl.registry and hrl.config (the typed run config) import only one another, and nothing heavy."""
    files = [ROOT / "hrl" / "errors.py", ROOT / "hrl" / "registry.py", *sorted((ROOT / "hrl" / "config").glob("*.py"))]
    bad = [f"{f.relative_to(ROOT)} imports {mod}" for f in files for mod, _ in _imports(f)
           if (mod.split(".")[0] == "hrl" and mod.split(".")[1:2] and mod.split(".")[1] not in BASE)
           or mod.split(".")[0] in HEAVY | {"transformers"}]  # fmt: skip
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["-c", "trainer.lr=-1"], "trainer.lr"),  # a value out of its bounds
        (["--async", "-c", "async.max_buffered=2", "-c", "async.batch_traces=16"], "async.max_buffered=2"),  # a rule
        (["--serve", "-c", "train.credit=turn"], "train.credit=turn"),  # across sections
    ],  # across fields
)
def test_a_refused_setting_imports_nothing_heavy(args, named, tmp_path):
    """`hrl train -c trainer.lr=-1`, or an async buffer that cannot hold a batch, is said (exit 2) from the typed
    config alone: no torch, transformers, peft, vLLM, aiohttp or Ray is imported to refuse it, and no run directory
    or model is made."""
    code = (
        "import sys\nfrom hrl.cli.main import run\n"
        f"sys.argv = ['hrl', 'train', '--recipe', 'demo', '--model', 'hrl:tiny', *{args!r}, '--run-dir', 'r']\n"
        "code = run()\nheavy = sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'transformers', 'peft', "
        "'vllm', 'aiohttp', 'ray'})\nprint('CODE', code, 'HEAVY', heavy)\n"
    )
    env = {**os.environ, "HRL_CACHE": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert "CODE 2 HEAVY []" in out.stdout, (out.stdout, out.stderr)
    assert named in out.stderr and not list(tmp_path.iterdir()), (out.stderr, list(tmp_path.iterdir()))


def test_no_engine_imports_from_the_proxy():
    """Engines serve token ids; the proxy (dialects, parsers, sessions) sits in front of them, never under."""
    bad = [
        f"{f.relative_to(ROOT)} imports {mod}"
        for f in sorted((ROOT / "runners" / "engines").glob("*.py"))
        for mod, _ in _imports(f)
        if mod.startswith("hrl.runners.proxy")
    ]
    assert not bad, "\n".join(bad)


def _file_graph() -> dict[Path, set[Path]]:
    """file -> the files of this checkout it imports (lazy imports too: a circle through them is still one)."""
    graph: dict[Path, set[Path]] = {}
    for layer in [*ORDER, "recipes", "hrl"]:
        for f in _files(layer):
            graph[f] = set()
            for mod in _imported_modules(f):
                target = _module_file(mod) or _package_file(mod)
                if target is not None and target != f:
                    graph[f].add(target)
    return graph


def _package_file(module: str) -> Path | None:
    parts = module.split(".")
    if parts[0] != "hrl":
        return None
    init = _source_dir(parts).joinpath(*parts[1:], "__init__.py") if len(parts) > 1 else ROOT / "hrl" / "__init__.py"
    return init if init.is_file() else None


def _circles(graph: dict[Path, set[Path]]) -> list[list[Path]]:
    """The strongly connected components with more than one file (Tarjan's algorithm, iteratively)."""
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    on: set[Path] = set()
    out: list[list[Path]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                part = []
                while True:
                    top = stack.pop()
                    on.discard(top)
                    part.append(top)
                    if top == node:
                        break
                if len(part) > 1:
                    out.append(part)
    return out


def test_no_circle_of_imports():
    """No files import one another in a circle, lazy imports counted (inside a folder or across: either way one of
    them holds what belongs below both, or imports back up). A package's __init__ is a file like any other: the
    modules it names import the module that defines a name, never the package."""
    a, b, c = Path("x/a.py"), Path("y/b.py"), Path("y/c.py")
    assert _circles({a: {b}, b: {c}, c: {a}}) != [] and _circles({a: {b}, b: {c}, c: set()}) == []  # it sees one
    bad = [" ↔ ".join(sorted(str(f.relative_to(ROOT)) for f in part)) for part in _circles(_file_graph())]
    assert not bad, "import circles:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    ("lower", "higher"),
    [("runners/proxy", "hrl.runners.online"), ("runners/trace.py", "hrl.runners.telemetry")],
    ids=["proxy-online", "trace-telemetry"],
)
def test_a_room_of_runners_imports_nothing_above_it(lower, higher):
    """The proxy serves an online run's clients through the object it is handed, never importing `runners.online`;
    the trace format is given its exporter (`TraceWriter(export=...)`), never reaching up for telemetry."""
    path = ROOT / lower
    files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
    bad = [f"{f.relative_to(ROOT)} imports {mod}" for f in files for mod, _ in _imports(f)
           if mod == higher or mod.startswith(higher + ".")]  # fmt: skip
    assert not bad, "\n".join(bad)
