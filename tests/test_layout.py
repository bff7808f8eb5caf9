"""The folders are the architecture: every import points down the layer order; the runner side stays light.

The order is written here once (CONTRIBUTING.md's "Architecture" section says the same in words):

    tracing, engine, version       the ground: they import no other part of the package
    serving                        over engine (and tracing's wire helpers)
    integrations                   over tracing
    rollouts                       over tracing and serving; never training, torch or vLLM
    training                       over all of the above; inside it:
        config, config_checks          the ground of training (over `rollouts.runners.Runners`)
        algorithm                      episodes -> samples, pure: config only
        update                         torch: config and algorithm
        records                        run folder, episodes, metrics, report: config
        run                            one run's parts, session, loop: all of the above and data
        (the rest: data, evaluation, group_rewards, sft, trainer) over all of training
    explorer                       the run explorer: reads tracing's stores and training's run folder
                                   (records), checks keys as serving does; nothing below imports it, and
                                   it never loads torch or vLLM
    cli, quickstart, runner, the package root   on top

Inside a room, the folders keep to their side (`SIDES`): a wire format's conversion never reaches for the
client capture, the server never patches clients, each served API's folder stands on chat's and the
tools' folders without reaching into another API's, and the engine's two backends (`engine/vllm/`,
`engine/transformers/`) never import each other, nor does what they share import either of them.

Imports inside functions and under `TYPE_CHECKING` count too: they are imports all the same.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

ALLOWED: dict[str, set[str]] = {
    "tracing": set(),
    "engine": set(),
    "version": set(),
    "serving": {"engine", "tracing", "version"},
    "integrations": {"tracing"},
    "rollouts": {"tracing", "serving"},
    "training": {"tracing", "engine", "serving", "rollouts"},
    "explorer": {"tracing", "serving", "training"},
}
"""For each room below the top, the other rooms it may import."""

TOP = {"cli", "quickstart", "runner", "__init__"}

TRAINING_ALLOWED: dict[str, set[str]] = {
    "config": {"config_checks"},
    "config_checks": set(),
    "algorithm": {"config"},
    "update": {"config", "config_checks", "algorithm"},
    "records": {"config"},
    "run": {"config", "config_checks", "algorithm", "update", "records", "data"},
}
"""Inside `training/`: what each part may import of `training/` besides itself (the rest is on top)."""

_ENGINE_BACKENDS = ("lightning_sdk.engine.vllm", "lightning_sdk.engine.transformers")
_ENGINE_SHARED = ("types", "base", "streams", "text", "placement", "models", "lora")
"""What both engine backends stand on; only the factory and the package face pick a backend."""
_API_FOLDERS = (
    "lightning_sdk.serving.chat",
    "lightning_sdk.serving.responses",
    "lightning_sdk.serving.messages",
)
SIDES: dict[str, tuple[str, ...]] = {
    "lightning_sdk.tracing.formats": (
        "lightning_sdk.tracing.capture",
        "lightning_sdk.tracing.rewards",
        "lightning_sdk.tracing.decorators",
        "lightning_sdk.tracing.config",
    ),
    "lightning_sdk.tracing.capture": (
        "lightning_sdk.tracing.rewards",
        "lightning_sdk.tracing.store",
        "lightning_sdk.tracing.config",
        "lightning_sdk.tracing.decorators",
    ),
    "lightning_sdk.serving": ("lightning_sdk.tracing.capture",),
    "lightning_sdk.serving.tools": (*_API_FOLDERS, "lightning_sdk.serving.context"),
    "lightning_sdk.serving.passthrough": (*_API_FOLDERS, "lightning_sdk.serving.tools"),
    "lightning_sdk.serving.chat": _API_FOLDERS[1:],
    "lightning_sdk.serving.responses": ("lightning_sdk.serving.messages",),
    "lightning_sdk.serving.messages": ("lightning_sdk.serving.responses",),
    _ENGINE_BACKENDS[0]: _ENGINE_BACKENDS[1:],
    _ENGINE_BACKENDS[1]: _ENGINE_BACKENDS[:1],
    **{f"lightning_sdk.engine.{part}": _ENGINE_BACKENDS for part in _ENGINE_SHARED},
    "lightning_sdk.training.run": (
        "lightning_sdk.training.trainer",
        "lightning_sdk.training.evaluation",
        "lightning_sdk.training.sft",
        "lightning_sdk.training.group_rewards",
    ),
}
"""For each folder (its modules and everything below), the modules and folders it must not import."""


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted((ROOT / "lightning_sdk").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    for path in sorted((ROOT / "integrations").glob("*.py")):
        stem = path.stem
        found["lightning_sdk.integrations" + ("" if stem == "__init__" else f".{stem}")] = path
    return found


def _imports(module: str, path: Path) -> list[tuple[str, int]]:
    """Every `lightning_sdk...` module `module` imports, with the line."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.append((name, node.lineno))
    return [(name, line) for name, line in found if name.split(".")[0] == "lightning_sdk"]


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _training_part(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "training" else None


def _wrong_way() -> list[str]:
    problems = []
    for module, path in _modules().items():
        room = _room(module)
        for target, line in _imports(module, path):
            where = f"{path.relative_to(ROOT)}:{line} imports {target}"
            other = _room(target)
            if other == "__init__" and room != "__init__":
                problems.append(f"{where}: nothing below the top imports the package root")
            elif room not in TOP and other != room and other not in ALLOWED[room]:
                problems.append(f"{where}: {room} may import only {sorted(ALLOWED[room]) or 'nothing'}")
            elif room == other == "training":
                part, target_part = _training_part(module), _training_part(target)
                allowed = TRAINING_ALLOWED.get(part or "")
                if allowed is not None and target_part != part and target_part not in allowed:
                    problems.append(f"{where}: training/{part} may import only {sorted(allowed)}")
    return problems


def test_every_import_points_down_the_layer_order() -> None:
    assert _wrong_way() == []


def _mutual_imports() -> list[str]:
    """Pairs of modules that import each other (under `TYPE_CHECKING` or inside a function too): one of
    the two was cut out of the other for length, not by job, and still reaches back into it."""
    edges = {module: {target for target, _ in _imports(module, path)} for module, path in _modules().items()}
    pairs = {
        tuple(sorted((module, target)))
        for module, targets in edges.items()
        for target in targets
        if target != module and module in edges.get(target, set())
    }
    return [f"{first} and {second} import each other" for first, second in sorted(pairs)]


def test_no_two_modules_import_each_other() -> None:
    assert _mutual_imports() == []


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _off_side() -> list[str]:
    problems = []
    for module, path in _modules().items():
        for folder, forbidden in SIDES.items():
            if not _within(module, folder):
                continue
            for target, line in _imports(module, path):
                for banned in forbidden:
                    if _within(target, banned):
                        problems.append(
                            f"{path.relative_to(ROOT)}:{line} imports {target}: {folder} must not"
                        )
    return problems


def test_each_folder_keeps_to_its_side() -> None:
    assert _off_side() == []


def test_the_side_check_sees_a_format_that_reaches_for_the_capture(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    formats = tmp_path / "lightning_sdk" / "tracing" / "formats"
    formats.mkdir(parents=True)
    (formats / "bad.py").write_text("from lightning_sdk.tracing.capture.patch import ClientPatch\n")
    chat = tmp_path / "lightning_sdk" / "serving" / "chat"
    chat.mkdir(parents=True)
    (chat / "bad.py").write_text("def f():\n    from lightning_sdk.serving.messages import api\n")
    vllm = tmp_path / "lightning_sdk" / "engine" / "vllm"
    vllm.mkdir(parents=True)
    (vllm / "bad.py").write_text("from lightning_sdk.engine.transformers.decode import Row\n")
    (tmp_path / "lightning_sdk" / "engine" / "types.py").write_text(
        "from lightning_sdk.engine.vllm.engine import VLLMEngine\n"
    )
    (tmp_path / "integrations").mkdir()
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    problems = _off_side()
    assert len(problems) == 4
    assert any("lightning_sdk.tracing.formats must not" in problem for problem in problems)
    assert any("lightning_sdk.serving.chat must not" in problem for problem in problems)
    assert any("lightning_sdk.engine.vllm must not" in problem for problem in problems)
    assert any("lightning_sdk.engine.types must not" in problem for problem in problems)


def test_the_check_sees_an_import_that_points_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The check must be able to fail: a copy of the tree where tracing imports training is caught.
    fake = tmp_path / "lightning_sdk" / "tracing"
    fake.mkdir(parents=True)
    (fake / "bad.py").write_text("from lightning_sdk.training.trainer import Trainer\n")
    (tmp_path / "lightning_sdk" / "training" / "algorithm").mkdir(parents=True)
    (tmp_path / "lightning_sdk" / "training" / "algorithm" / "bad.py").write_text(
        "def f():\n    from lightning_sdk.training.update import step\n"
    )
    (tmp_path / "integrations").mkdir()
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    problems = _wrong_way()
    assert len(problems) == 2
    assert (
        "tracing may import only nothing" in problems[0] or "tracing may import only nothing" in problems[1]
    )
    assert any("training/algorithm may import only ['config']" in problem for problem in problems)


@pytest.mark.parametrize(
    "module",
    [
        "lightning_sdk.rollouts.runner",
        "lightning_sdk.runner",
        "lightning_sdk.rollouts.gateway",
    ],
)
def test_the_runner_side_loads_no_trainer_torch_or_vllm(module: str) -> None:
    script = (
        f"import sys, {module};"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('torch', 'vllm', 'transformers', 'peft')"
        " or m.startswith('lightning_sdk.training')];"
        "print(','.join(sorted(heavy)))"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == ""


@pytest.mark.parametrize("module", ["lightning_sdk.explorer.app", "lightning_sdk.explorer.snapshot"])
def test_the_explorer_loads_no_torch_transformers_or_vllm(module: str) -> None:
    # `lightning-sdk view` starts in about a second, also on a machine without them.
    script = (
        f"import sys, {module};"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('torch', 'vllm', 'transformers', 'peft')];"
        "print(','.join(sorted(heavy)))"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == ""


def test_importing_the_package_loads_no_client_engine_or_capture() -> None:
    # An agent process imports the package first; the clients and their capture load with the first
    # traced call (benchmarks/import_time.py measures the import itself).
    script = (
        "import sys, lightning_sdk;"
        "heavy = [m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'vllm', 'transformers', 'peft', 'openai', 'anthropic', 'httpx', 'pydantic', 'sqlite3')"
        " or m.startswith(('lightning_sdk.tracing.capture', 'lightning_sdk.training',"
        " 'lightning_sdk.serving'))];"
        "print(','.join(sorted(heavy)))"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == ""


MAX_FUNCTION_LINES, MAX_FILES_PER_FOLDER = 80, 12


def test_no_function_is_longer_than_a_screen_and_no_folder_holds_more_than_twelve_modules() -> None:
    long_functions, crowded = [], []
    for folder in [ROOT / "lightning_sdk", *(ROOT / "lightning_sdk").rglob("*/")]:
        modules = list(folder.glob("*.py"))
        if len(modules) > MAX_FILES_PER_FOLDER:
            crowded.append(f"{folder.relative_to(ROOT)}: {len(modules)}")
    for path in (ROOT / "lightning_sdk").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long_functions.append(f"{path.relative_to(ROOT)}:{node.name} ({lines} lines)")
    assert not long_functions, f"split these into named steps: {long_functions}"
    assert not crowded, f"give these folders subfolders by job: {crowded}"
