"""The run report opened in a real headless Chromium (through Playwright): every curve loads, nothing
errors, and the episodes open on a click.

Needs a Chromium executable (`chromium-headless-shell` or `chromium`; Debian packages of those names, which
`.ci/run` installs); without one the test is skipped with that reason.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lightning_sdk.tracing.episode import Episode, LLMCall
from lightning_sdk.tracing.store import EpisodeStore
from lightning_sdk.training.records.metrics import MetricsWriter
from lightning_sdk.training.records.report import write_report

CHROMIUM = shutil.which("chromium-headless-shell") or shutil.which("chromium")


def solved_episode(step: int, reward: float, evaluation: bool = False) -> Episode:
    tool_call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "calculator", "arguments": json.dumps({"expression": "20 - 5"})},
    }
    call = LLMCall(
        agent_name="math_solver",
        messages=[{"role": "user", "content": "Mia had 20 eggs and gave 5 away. <b>not markup</b>"}],
        response_message={"role": "assistant", "content": None, "tool_calls": [tool_call]},
    )
    metadata = {"step": step, **({"evaluation": True} if evaluation else {})}
    episode = Episode(name="solver", task={"q": step}, output="15", calls=[call], metadata=metadata)
    episode.rewards["answer"] = reward
    return episode


@pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium (apt-get install chromium-headless-shell)")
def test_the_report_renders_in_a_headless_browser(tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    with MetricsWriter(tmp_path) as writer:
        writer.log(0, {"val_reward": 0.0})
        for step in range(1, 9):
            record = {"reward_mean": step / 10, "groups": 4, "groups_rolled_out": 4, "groups_with_signal": 2}
            writer.log(step, record)
            if step % 4 == 0:
                writer.log(step, {"val_reward": step / 20})
    with EpisodeStore(tmp_path / "episodes.sqlite") as store:
        store.add_many([solved_episode(8, 1.0), solved_episode(8, 0.0)])
    with EpisodeStore(tmp_path / "evaluations.sqlite") as store:
        store.add(solved_episode(8, 1.0, evaluation=True))
    report = write_report(tmp_path)

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            errors: list[str] = []
            page.on(
                "console", lambda message: errors.append(message.text) if message.type == "error" else None
            )
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(report.as_uri())
            images = page.eval_on_selector_all(
                "img", "images => images.map(image => [image.getAttribute('src'), image.naturalWidth])"
            )
            headings = page.eval_on_selector_all("h2", "items => items.map(item => item.textContent)")
            summaries = page.locator("details summary")
            summary_count = summaries.count()
            summaries.first.click()
            opened = page.locator("details[open] pre").first.inner_text()
        finally:
            browser.close()

    assert errors == []
    assert sorted(images) == [["reward.png", 640], ["signal.png", 640], ["validation.png", 640]]
    assert headings == ["Sample episodes (last step)", "Held-out episodes (last evaluation)", "Configuration"]
    assert summary_count == 3  # two training episodes of the last step, one held-out episode
    assert "<b>not markup</b>" in opened  # episode text is escaped, shown as text
