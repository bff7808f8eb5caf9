"""The README is a newcomer's first screen: it fits on one, and every path it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES, MAX_WIDTH = 90, 100


def test_the_readme_fits_on_a_screen() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines; move details to docs/"
    wide = [(number, len(line)) for number, line in enumerate(lines, 1) if len(line) > MAX_WIDTH]
    assert not wide, f"README.md lines over {MAX_WIDTH} characters (line, width): {wide}"


def test_every_file_and_folder_the_readme_names_exists() -> None:
    text = (ROOT / "README.md").read_text()
    named = set(re.findall(r"\]\(([^)#]+)", text))  # link targets
    named |= set(re.findall(r"`((?:docs|examples|benchmarks|lightning_sdk)/[\w./-]*)`", text))
    named |= {"CONTRIBUTING.md"} if "CONTRIBUTING.md" in text else set()
    missing = sorted(path for path in named if "<" not in path and not (ROOT / path).exists())
    assert not missing, f"README.md names what does not exist: {missing}"
