"""Screenshots of the run explorer's main views for docs/explorer.md, in a headless Chromium.

    .venv/bin/python scripts/explorer_screenshots.py [RUN_DIR]

Without RUN_DIR it browses a synthetic run written by the run folder's own writers
(`tests/fixtures/explorer_runs.py`: a calculator agent whose samples call the tool right or wrong). Writes
docs/assets/explorer-run.png, -step.png, -episode.png, -held-out.png and, over a store of production
episodes with late feedback, -store.png.
"""

from __future__ import annotations

import random
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lightning_sdk.explorer import serve_explorer  # noqa: E402
from lightning_sdk.tracing.rewards.feedback import Feedback  # noqa: E402
from lightning_sdk.tracing.store import EpisodeStore  # noqa: E402
from tests.fixtures.explorer_runs import synthetic_run, tool_episode  # noqa: E402

ASSETS = ROOT / "docs" / "assets"


def production_store(path: Path) -> Path:
    """A store of production episodes of the same agent, some with late feedback."""
    rng = random.Random(1)
    with EpisodeStore(path) as store:
        episodes = [
            tool_episode(
                {"question": f"What is {n} + {n + 3}?", "expression": f"{n} + {n + 3}"},
                rng.random() < 0.7,
                rng,
            )
            for n in range(30)
        ]
        for index, episode in enumerate(episodes):
            episode.run_id, episode.rewards = "production", {}
            episode.started_at -= 60 * (30 - index)
        store.add_many(episodes)
        for episode in episodes[::4]:
            store.add_feedback(
                episode.id,
                Feedback(reward=1.0 if rng.random() < 0.6 else 0.0, name="thumbs_up", source="http"),
            )
    return path


def main() -> None:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium-headless-shell") or shutil.which("chromium")
    if chromium is None:
        raise SystemExit("no headless Chromium: apt-get install chromium-headless-shell")
    with tempfile.TemporaryDirectory() as folder:
        run_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(folder) / "calculator-run"
        if len(sys.argv) == 1:
            synthetic_run(run_dir, steps=12, tasks_per_step=4, group_size=4, eval_every=4, held_out=6)
        with serve_explorer(run_dir, port=0) as server, sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 900}, device_scale_factor=1)
            page.goto(server.url)
            page.wait_for_selector("figure.chart svg circle")
            page.screenshot(path=ASSETS / "explorer-run.png", full_page=False)
            page.locator("a.step-link").nth(5).click()
            page.wait_for_selector("section.group")
            page.screenshot(path=ASSETS / "explorer-step.png", full_page=False)
            page.locator("a.sample.failed").first.click()
            for summary in page.locator("details.call summary").all()[:2]:
                summary.click()  # the tool call, and the call that read its result
            page.screenshot(path=ASSETS / "explorer-episode.png", full_page=False)
            page.goto(server.url + "held-out")
            page.screenshot(path=ASSETS / "explorer-held-out.png", full_page=False)
            store = production_store(Path(folder) / "production.db")
            with serve_explorer(store=store, port=0) as production:
                page.goto(production.url)
                page.screenshot(path=ASSETS / "explorer-store.png", full_page=False)
            browser.close()
    for name in ("run", "step", "episode", "held-out", "store"):
        print(ASSETS / f"explorer-{name}.png")


if __name__ == "__main__":
    main()
