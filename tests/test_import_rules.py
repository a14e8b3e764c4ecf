"""The layering of the package, read from the source with ``ast`` (every import statement, those inside
functions included).

Every wing (docs/ARCHITECTURE.md, "Who owns what") imports only the wings of its allow-list (``MAY_IMPORT``) and of
them only their public faces (``PUBLIC``); no module imports another's private name; an app imports no other app.
terra/core/ (the ground floor) imports nothing of the project's; terra/contract/ (the model's contract: actions,
routes, the token layout) stands on it alone, with numpy; terra.tokenizer stands alone on it;
terra.decoder builds on terra.tokenizer and terra/core/ only; the world model (terra/models/) runs without vLLM;
the pipeline and the apps reach a backend only through terra.generation.backends; the light layer
(terra/config/) imports no torch, Transformers or vLLM; terra/inputs/ names no backend; terra/closedloop/ keeps the
loop's core at its root and its sub-packages by floor (the drive run never imports the fidelity study); the old
top-level names ``tokenizer`` and ``decoder`` and the removed aliases of modules moved before are gone; no package
exports the name of one of its modules; ``import terra.tokenizer`` and ``import terra`` stay light.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BACKEND_MODULES = ("terra.generation.hf_backend", "terra.generation.vllm_backend", "terra.generation.vllm_streaming")
SKIPPED_DIRS = {"tests", "build", "dist", "outputs", "multirun", "runs", "__pycache__"}


INSTALLED_AS = {"tokenizer": "terra.tokenizer", "decoder": "terra.decoder", "conf": "terra.conf"}  # pyproject.toml


def module_name(path: Path) -> str:
    """``terra/generation/rollout.py`` → ``terra.generation.rollout`` (a package's ``__init__`` → the package);
    the top-level folders installed under the namespace by their installed names (``tokenizer/base.py`` →
    ``terra.tokenizer.base``)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    parts[0] = INSTALLED_AS.get(parts[0], parts[0])
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every module an import statement of ``source`` (the code of ``module``) names, relative imports resolved;
    for ``from a import b`` both ``a`` and ``a.b`` (``b`` may be a submodule)."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *([base] if base else [])])
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def imported_modules(path: Path) -> set[str]:
    """:func:`imports_of` a file of the repository."""
    return imports_of(path.read_text(), module_name(path), path.name == "__init__.py")


def sources(*parts: str) -> list[Path]:
    """The Python files of a folder (recursively) or one file, relative to the repository root."""
    path = ROOT.joinpath(*parts)
    files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
    assert files, f"{path} has no Python files"
    return files


def within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


# Aliases of modules moved before: gone, not kept as shims.
REMOVED = ("terra.errors", "terra.validation", "terra.actions", "terra.trajectory", "terra.hydra_app", "terra.cli")
# folder or file → modules it must not import (a name and everything below it)
RULES = {
    "terra/core": ("terra", "tokenizer", "decoder", "numpy", "omegaconf", "hydra"),  # torch: inside functions
    "tokenizer": ("terra", "tokenizer", "decoder"),
    "decoder": ("terra", "tokenizer", "decoder"),
    "terra/models": ("vllm", "terra.vllm"),
    "terra/pipeline.py": BACKEND_MODULES,
    "terra/apps": BACKEND_MODULES,
    "terra/closedloop": BACKEND_MODULES,
    "terra/alpasim": BACKEND_MODULES,
    "terra/sim": ("terra.generation",),
    "terra/contract": ("torch", "transformers", "vllm", "omegaconf", "hydra"),  # numpy and terra/core/ only
    "terra/roads": ("torch", "transformers", "vllm", "omegaconf", "hydra"),  # numpy (pyarrow inside its map reader)
    "terra/config": ("torch", "transformers", "vllm", "terra.apps", "terra.batch", "terra.generation", "terra.inputs",
                     "terra.models", "terra.pipeline", "terra.serve", "terra.session", "terra.sim", "terra.vllm"),
    "terra/inputs": ("terra.generation.backends", *BACKEND_MODULES, "terra.pipeline"),
}
# Inside the closed-loop wing (terra/closedloop/__init__.py): the loop's core at its root, then its concerns, each
# importing only those below it: car/ < policies/ < outcomes/ < recording/ (the run) < study/ (its client), gym/
CLOSED_LOOP_CORE = ("loop", "plans", "worlds", "user_world", "scenarios", "scenario_maps", "guard")
CLOSED_LOOP_FLOORS = ("car", "policies", "outcomes", "recording", "study")
for _name in CLOSED_LOOP_CORE:
    RULES[f"terra/closedloop/{_name}.py"] = tuple(f"terra.closedloop.{p}" for p in (*CLOSED_LOOP_FLOORS[1:], "gym"))
for _floor, _package in enumerate(CLOSED_LOOP_FLOORS):
    RULES[f"terra/closedloop/{_package}"] = tuple(f"terra.closedloop.{p}" for p in (*CLOSED_LOOP_FLOORS[_floor + 1:],
                                                                                    "gym"))
# modules a rule's folder may import although a forbidden name covers them
ALLOWED = {"terra/core": ("terra.core",), "tokenizer": ("terra.core", "terra.tokenizer"),
           "decoder": ("terra.core", "terra.tokenizer", "terra.decoder")}


# Every wing of the package (docs/ARCHITECTURE.md, "Who owns what"): a module's wing is its second name, except the
# pipeline's trunk (six modules at the top of terra/) and conf/ (Hydra's configs: the config wing).
TRUNK = ("terra.pipeline", "terra.run", "terra.outputs", "terra.refiner", "terra.metrics", "terra.stats")
# wing → the only other wings it may import (an allow-list: a new import across wings is a decision, made here)
MAY_IMPORT = {
    "core": set(),
    "contract": {"core"},  # the model's contract: actions, routes, the token layout
    "roads": {"core", "contract"},  # lane centrelines from maps, files and scenes, and the routes they give
    "tokenizer": {"core"},
    "decoder": {"core", "tokenizer"},
    "config": {"core", "contract", "tokenizer", "decoder"},
    "models": {"core", "contract", "config", "tokenizer"},
    "vllm": {"core", "contract", "config", "models", "generation"},
    "generation": {"core", "contract", "config", "models", "vllm"},
    "inputs": {"core", "contract", "config", "generation", "tokenizer"},
    "sim": {"core", "contract", "config", "inputs", "tokenizer"},
    "pipeline": {"core", "contract", "config", "generation", "models", "inputs", "tokenizer", "decoder",
                 "vllm"},  # vllm: plugin
    "session": {"core", "contract", "config", "generation", "inputs", "sim", "tokenizer", "pipeline"},
    "serve": {"core", "contract", "config", "generation", "session", "tokenizer", "decoder", "pipeline"},
    "batch": {"core", "contract", "config", "generation", "inputs", "models", "pipeline", "tokenizer", "decoder"},
    "training": {"core", "contract", "config", "generation", "inputs", "models", "sim", "pipeline", "tokenizer",
                 "decoder"},
    "scoring": {"core", "config", "tokenizer"},
    "evaluation": {"core", "contract", "config", "generation", "inputs", "models", "sim", "pipeline", "tokenizer"},
    "closedloop": {"core", "contract", "config", "generation", "inputs", "models", "sim", "scoring", "pipeline",
                   "tokenizer", "decoder", "fidelity"},
    "alpasim": {"core", "contract", "config", "generation", "inputs", "tokenizer", "decoder"},
    "fidelity": {"sim", "inputs", "pipeline"},  # the renderer's camera and scene, PSNR / SSIM, the stats
    "face": {"core"},  # terra/__init__.py: the user-facing TerraInputError
}
for _wing in ("sim", "inputs", "alpasim", "training", "closedloop", "session", "serve", "batch", "evaluation"):
    MAY_IMPORT[_wing].add("roads")  # the wings that read a road or turn one into routes
MAY_IMPORT["apps"] = set(MAY_IMPORT) - {"apps", "face"}
# wing → the modules other wings may import (its public faces); a wing not listed here is public as a whole
PUBLIC = {
    "tokenizer": {"terra.tokenizer", "terra.tokenizer.base", "terra.tokenizer.images", "terra.tokenizer.resize",
                  "terra.tokenizer.tensors"},
    "decoder": {"terra.decoder", "terra.decoder.writers", "terra.decoder.sidecar", "terra.decoder.overlay",
                "terra.decoder.frames", "terra.decoder.refiner", "terra.decoder.refiner.model"},
    "models": {"terra.models", "terra.models.checkpoint", "terra.models.presets", "terra.models.modeling_llama_action",
               "terra.models.configuration_llama_action"},
    "vllm": {"terra.vllm", "terra.vllm.compat", "terra.vllm.plugin"},
    "contract": {"terra.contract", "terra.contract.actions", "terra.contract.routes", "terra.contract.layout"},
    "roads": {"terra.roads", *(f"terra.roads.{m}" for m in ("road", "follow", "clipgt", "files"))},
    "generation": {"terra.generation", "terra.generation.rollout", "terra.generation.pass_stats",
                   "terra.generation.backends", "terra.generation.resolve", "terra.generation.sampling",
                   "terra.generation.speculative", "terra.generation.session_engine"},  # backends: the wing's own
    "session": {"terra.session", "terra.session.driver_input", "terra.session.context"},
    "serve": {"terra.serve.settings", "terra.serve.service", "terra.serve.app"},
    "batch": {"terra.batch", "terra.batch.config", "terra.batch.run"},
    "training": {f"terra.training.{m}" for m in ("settings", "run", "prepare_logs", "shards", "blend", "tokenize",
                                                  "tokenizer_settings", "tokenizer_run")},
    "scoring": {"terra.scoring", *(f"terra.scoring.{m}" for m in ("settings", "run", "check", "estimator", "labels",
                                                                  "metrics", "videos"))},
    "evaluation": {"terra.evaluation", "terra.evaluation.settings", "terra.evaluation.run"},
    "closedloop": {"terra.closedloop", *(f"terra.closedloop.{m}" for m in (  # the run and what terra-drive composes
        "recording.run", "recording.drives", "recording.settings", "loop", "scenarios", "scenario_maps", "worlds",
        "policies.builtin", "study.report", "study.settings", "study.drives", "outcomes.plan_following",
        "policies.egodriver", "policies.navsim", "gym.env", "policies.vision"))},
    "alpasim": {"terra.alpasim.settings", "terra.alpasim.sessions", "terra.alpasim.service", "terra.alpasim.client"},
    "apps": {"terra.apps.runner", "terra.apps.help"},  # an app imports no other app
}
PACKAGE_FOLDERS = ("terra", "tokenizer", "decoder")


def wing_of(module: str) -> str | None:
    """The wing of a module of the package (None for a module outside it)."""
    parts = module.split(".")
    if parts[0] != "terra":
        return None
    if len(parts) == 1:
        return "face"
    return "pipeline" if within(module, TRUNK) else {"conf": "config"}.get(parts[1], parts[1])


def package_sources() -> list[Path]:
    return [path for folder in PACKAGE_FOLDERS for path in sources(folder)]


def test_every_wing_of_the_package_has_its_rules():
    wings = {wing_of(module_name(path)) for path in package_sources()}
    assert wings == set(MAY_IMPORT), f"wings without rules: {wings - set(MAY_IMPORT)}; rules of no wing: " \
                                     f"{set(MAY_IMPORT) - wings}"


def test_each_wing_imports_only_the_public_faces_of_the_wings_it_stands_on():
    broken = []
    for path in package_sources():
        home = wing_of(module_name(path))
        for name in sorted(imported_modules(path)):
            other = wing_of(name)
            if other is None or other == home or name == "terra":
                continue
            public = PUBLIC.get(other)
            if other not in MAY_IMPORT[home]:
                broken.append(f"{path.relative_to(ROOT)} ({home}) imports {name} ({other})")
            elif public is not None and name not in public and name.rpartition(".")[0] not in public:
                broken.append(f"{path.relative_to(ROOT)} ({home}) imports {name}, private to {other}")
    assert not broken, "\n".join(broken)


def test_an_app_imports_no_other_app():
    broken = [f"{path.relative_to(ROOT)} imports {name}" for path in sources("terra", "apps")
              for name in sorted(imported_modules(path))
              if within(name, ("terra.apps",)) and name not in ("terra.apps", module_name(path))
              and not within(name, ("terra.apps.runner", "terra.apps.help"))]
    assert not broken, "\n".join(broken)


def test_no_module_imports_a_private_name_of_another():
    broken = []
    for path in package_sources():
        me = module_name(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level and node.module != me \
                    and wing_of(node.module) is not None:
                broken += [f"{path.relative_to(ROOT)} imports {node.module}.{alias.name}" for alias in node.names
                           if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert not broken, "\n".join(broken)


def test_the_import_reader_names_the_wings():
    assert [wing_of(m) for m in ("terra.core.errors", "terra.tokenizer.base", "terra.conf", "terra.pipeline",
                                 "terra.metrics", "terra", "numpy")] == [
        "core", "tokenizer", "config", "pipeline", "pipeline", "face", None]


def exported_names(init: Path) -> set[str]:
    """The names a package's ``__init__.py`` exports: its ``__all__``, a list or tuple, or the keys of the table of a
    lazy face (terra/core/lazy.py: ``__all__, __getattr__ = lazy_face(__name__, _HOMES)``)."""
    assigned: dict[str, ast.expr] = {}
    for node in ast.parse(init.read_text()).body:
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            if isinstance(target, ast.Name):
                assigned[target.id] = node.value
            elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Call):  # a lazy face: its table
                names = [element.id for element in target.elts if isinstance(element, ast.Name)]
                if "__all__" in names and getattr(node.value.func, "id", None) == "lazy_face":
                    assigned["__all__"] = node.value.args[1]
    value = assigned.get("__all__")
    if isinstance(value, ast.Name):
        value = assigned[value.id]
    if isinstance(value, ast.Dict):
        return {key.value for key in value.keys}
    return set() if value is None else {element.value for element in value.elts}


def test_no_package_exports_the_name_of_one_of_its_modules():
    """Importing a submodule binds it on its package, so an exported name equal to a submodule's (``terra.batch.plan``,
    once both the planning function and its module) would be the one or the other by import order."""
    faces = [path for path in package_sources() if path.name == "__init__.py"]
    clashes, unread = [], []
    for init in faces:
        names = exported_names(init)
        if not names and "__all__" in init.read_text():
            unread.append(str(init.relative_to(ROOT)))
        modules = {path.stem for path in init.parent.glob("*.py")}
        modules |= {path.name for path in init.parent.iterdir() if (path / "__init__.py").exists()}
        clashes += [f"{module_name(init)}.{name}" for name in sorted(names & modules)]
    assert not unread, f"__all__ not read from {unread}"
    assert not clashes, f"exported names that are also modules of their package: {clashes}"
    import terra.batch
    import terra.config

    for package in (terra.batch, terra.config):  # the reader reads a lazy face and a list as Python does
        assert exported_names(Path(package.__file__)) == set(package.__all__)


@pytest.mark.parametrize("where", list(RULES))
def test_layering(where):
    forbidden, allowed = RULES[where], ALLOWED.get(where, ())
    broken = [f"{path.relative_to(ROOT)} imports {name}"
              for path in sources(*where.split("/")) for name in sorted(imported_modules(path))
              if within(name, forbidden) and not within(name, allowed)]
    assert not broken, "\n".join(broken)


def test_the_closed_loop_keeps_only_its_core_at_its_root():
    root = {path.stem for path in ROOT.joinpath("terra", "closedloop").glob("*.py")} - {"__init__"}
    assert root == set(CLOSED_LOOP_CORE), f"beyond the loop's core at terra/closedloop/: {root - set(CLOSED_LOOP_CORE)}"


def test_the_closed_loop_rules_catch_an_upward_import():  # the control: a run that imports the study is refused
    forbidden = RULES["terra/closedloop/recording"]
    names = imports_of("from terra.closedloop.study.report import study_run", "terra.closedloop.recording.drives")
    assert any(within(name, forbidden) for name in names)


def test_the_removed_aliases_are_gone():
    kept = [name for name in REMOVED if ROOT.joinpath(*name.split(".")).with_suffix(".py").exists()]
    assert not kept, f"aliases still in the tree: {kept}"
    inputs = (ROOT / "terra" / "inputs" / "__init__.py").read_text()
    assert "builtin_context" not in inputs  # moved to terra.sim: no alias on terra.inputs
    broken = [f"{path.relative_to(ROOT)} imports {name}" for path in repository_sources() + sources("tests")
              if path.name != "test_import_rules.py"
              for name in sorted(imported_modules(path)) if within(name, REMOVED)]
    assert not broken, "\n".join(broken)


OLD_TOP_LEVEL = re.compile(r"(?<![\w.])(from|import)\s+(tokenizer|decoder)\b")


def test_nothing_imports_the_old_top_level_names():
    """``tokenizer`` and ``decoder`` install as ``terra.tokenizer`` and ``terra.decoder`` only; from the repository
    root the old names would still import (the folders are on ``sys.path``) and load a second copy of every module.
    A regex over the text, so code in strings, notebooks, shell scripts and the Makefile counts too."""
    texts = repository_sources() + sources("tests") + sorted(ROOT.glob("notebooks/*.ipynb"))
    texts += sorted(ROOT.glob("scripts/**/*.sh")) + [ROOT / "Makefile", ROOT / "README.md"]
    broken = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for path in texts if path.name != "test_import_rules.py"
              for n, line in enumerate(path.read_text().splitlines(), 1) if OLD_TOP_LEVEL.search(line)]
    assert not broken, "\n".join(broken)


def test_the_light_layer_loads_no_torch():
    code = "import sys, terra.config; assert 'torch' not in sys.modules, 'torch was imported'"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


# console script → the module its settings are checked in, before any model loads (terra/apps/*.py); terra-generate
# and terra-make-dataset check theirs in the app module itself
SETTINGS_MODULES = {
    "terra-generate": "terra.apps.generate", "terra-rollout": "terra.batch.config",
    "terra-serve": "terra.serve.settings", "terra-drive": "terra.closedloop.study.settings",
    "terra-train": "terra.training.settings", "terra-prepare-logs": "terra.training.prepare_logs",
    "terra-blend": "terra.training.blend", "terra-score": "terra.scoring.settings",
    "terra-evaluate": "terra.evaluation.settings", "terra-train-tokenizer": "terra.training.tokenizer_settings",
    "terra-tokenize": "terra.training.tokenize", "terra-make-dataset": "terra.apps.make_dataset",
    "terra-alpasim": "terra.alpasim.settings",
}


def console_scripts() -> dict[str, str]:
    """pyproject.toml's console scripts: name → the app's module."""
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    return {name: target.partition(":")[0] for name, target in scripts.items()}


def test_every_app_has_its_settings_module_named():
    apps = console_scripts()
    assert set(SETTINGS_MODULES) == set(apps), f"apps without a settings module: {set(apps) - set(SETTINGS_MODULES)}"
    for name, app in apps.items():
        settings = SETTINGS_MODULES[name]
        assert settings == app or settings in imported_modules(ROOT.joinpath(*app.split(".")).with_suffix(".py")), \
            f"{name} ({app}) does not import {settings}"


@pytest.mark.parametrize("app", sorted(SETTINGS_MODULES))
def test_every_apps_settings_load_without_torch(app):
    """An app checks its settings (and answers a bad one in one line) before torch loads (the guide's rule)."""
    modules = ", ".join(dict.fromkeys([console_scripts()[app], SETTINGS_MODULES[app]]))
    code = f"import sys, {modules}; assert 'torch' not in sys.modules, 'torch was imported'"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_the_ground_floor_loads_no_torch():
    code = ("import sys, terra.core.errors, terra.core.atomic, terra.core.lock, terra.core.folders, terra.core.device,"
            " terra.core.ray_cluster; assert 'torch' not in sys.modules, 'torch was imported';"
            " assert 'ray' not in sys.modules, 'ray was imported'")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_the_import_reader_sees_imports_inside_functions_and_relative_ones():
    source = "def f():\n    from ..generation import hf_backend\n    import vllm.engine\nfrom . import scene\n"
    assert imports_of(source, "terra.sim.probe") == {
        "terra.generation", "terra.generation.hf_backend", "vllm.engine", "terra.sim", "terra.sim.scene"}
    assert imports_of("from .clips import Clip", "terra.sim", is_package=True) == {"terra.sim.clips",
                                                                                  "terra.sim.clips.Clip"}


@pytest.mark.parametrize("package", ["terra.tokenizer", "terra"])
def test_import_is_light(package):
    code = f"import sys, {package}; assert 'transformers' not in sys.modules, 'transformers was imported'"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def repository_sources() -> list[Path]:
    """The Python files of the repository outside tests/, hidden folders and build or run outputs."""
    files = []
    for folder, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS]
        files += [Path(folder) / name for name in names if name.endswith(".py")]
    return files
