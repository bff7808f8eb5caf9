"""The wheel a user installs holds every package of the source tree (a package missing from pyproject's
`packages` list works in the editable install the tests use, and fails with ImportError for users), and
the `py.typed` marker that tells type checkers the package is typed."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Source folder -> package name in the wheel (pyproject's package-dir).
MAPPED = {
    "lightning_sdk": "lightning_sdk",
    "integrations": "lightning_sdk/integrations",
    "examples": "lightning_sdk/examples",
}


def test_the_wheel_holds_every_package_and_the_typed_marker(tmp_path: Path) -> None:
    # Built from a copy: setuptools reuses a `build/` folder, which can still hold packages the list lost.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", *MAPPED):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
        copy(ROOT / name, source / name, **_ignore_caches(ROOT / name))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(source),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("lightning_sdk-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        f"{MAPPED[folder]}/{init.parent.relative_to(ROOT / folder).as_posix()}/__init__.py".replace(
            "/./", "/"
        )
        for folder in MAPPED
        for init in (ROOT / folder).rglob("__init__.py")
    }
    assert expected - names == set()
    assert "lightning_sdk/py.typed" in names
    # The run explorer's page and script are package data: without them `lightning-sdk view` serves nothing.
    explorer = ROOT / "lightning_sdk" / "explorer"
    shipped = {
        f"lightning_sdk/explorer/{folder}/{path.name}"
        for folder in ("templates", "static")
        for path in (explorer / folder).iterdir()
    }
    assert shipped and shipped - names == set()


def _ignore_caches(path: Path) -> dict[str, object]:
    return {"ignore": shutil.ignore_patterns("__pycache__", "*.png")} if path.is_dir() else {}
