"""The run explorer in a real headless Chromium (through Playwright), over a run of a short real training.

One lean fit on the session's vLLM engine (module-scoped, with `TrainerConfig(explorer=True)`) is browsed as a
newcomer would: step -> group -> its samples with their rewards -> one episode -> one call with its credited
reward and advantage; a filter narrows the groups; a line appended to `metrics.jsonl` appears on the open page
without a reload; the one-file `report.html` shows the same group. Recorded `<script>` and `javascript:` text
never runs, on any page.

Needs a Chromium executable (`chromium-headless-shell` or `chromium`; `.ci/run` installs the Debian package);
without one the tests are skipped with that reason.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

import lightning_sdk as ls
from lightning_sdk.explorer import serve_explorer, write_snapshot
from tests.fixtures.explorer_runs import synthetic_run
from tests.fixtures.openai_server import recording_state_restored

CHROMIUM = shutil.which("chromium-headless-shell") or shutil.which("chromium")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no headless Chromium (apt-get install chromium-headless-shell)"
)

TASKS = [{"id": i, "question": f"Name a colour number {i}."} for i in range(4)]


@ls.reward
def length_reward(task: dict[str, Any], answer: str) -> float:
    return len(answer) / 40


@ls.trace_agent(name="solver")
def solver(task: dict[str, Any]) -> str:
    reply = openai.OpenAI().chat.completions.create(
        model="any", messages=[{"role": "user", "content": task["question"]}], max_tokens=8
    )
    answer = reply.choices[0].message.content or ""
    length_reward(task, answer)
    return answer


@pytest.fixture(scope="module")
def trained_run(vllm_engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """A two-step run on the bundled model, with the explorer switched on; what the run printed."""
    run_dir = tmp_path_factory.mktemp("explorer-fit") / "run"
    config = ls.TrainerConfig(
        group_size=4,
        batch_size=2,
        max_steps=2,
        max_tokens=8,
        eval_every=0,
        run_dir=str(run_dir),
        progress_bar=False,
        max_concurrency=8,
        explorer=True,
    )
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed), recording_state_restored():
            ls.Trainer(config=config, engine=vllm_engine).fit(solver, TASKS, val_dataset=TASKS[:2])
    finally:
        vllm_engine.load_adapter(None, version=None)  # base weights back for the next module
    yield run_dir, printed.getvalue()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()


@contextlib.contextmanager
def page_of(browser: Any) -> Iterator[tuple[Any, list[str]]]:
    """A fresh page, and the script errors it reports (none expected)."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    try:
        yield page, errors
    finally:
        page.close()


@pytest.mark.slow  # the module's one short training
def test_the_run_prints_the_explorer_address_at_its_start(trained_run: tuple[Path, str]) -> None:
    run_dir, printed = trained_run
    assert re.search(r"Run explorer: http://127\.0\.0\.1:\d+/ ", printed)
    assert f"lightning-sdk view {run_dir}" in printed


@pytest.mark.slow  # the module's one short training
def test_step_group_samples_episode_call_in_clicks(trained_run: tuple[Path, str], browser: Any) -> None:
    run_dir, _ = trained_run
    with serve_explorer(run_dir) as server, page_of(browser) as (page, errors):
        page.goto(server.url)
        page.wait_for_selector("figure[data-chart='reward'] circle")
        assert page.locator("a.step-link").all_inner_texts() == ["step 2", "step 1"]
        page.locator("a.step-link", has_text="step 2").click()  # 1: the step
        page.wait_for_url("**/step/2")
        page.wait_for_selector("section.group")
        groups = page.locator("section.group")
        assert groups.count() == 2  # batch_size tasks, one group each
        first = groups.first
        rewards = first.locator(".sample .reward").all_inner_texts()
        assert len(rewards) == 4 and all(re.fullmatch(r"\d+\.\d{3}", reward) for reward in rewards)
        assert first.locator("header .task").inner_text().startswith('{"id": ')
        has_signal = first.locator("header .signal").count() == 1
        first.locator("a.sample").first.click()  # 2: one sample's episode
        page.wait_for_selector("details.call")
        assert page.locator("h1").inner_text() == "Episode of solver"
        call = page.locator("details.call").first
        call.locator("summary").click()  # 3: its call
        signal = call.locator(".signal-table")
        # The run recorded what credit assignment made of the call (training/algorithm/prepare.py).
        assert re.fullmatch(r"-?\d+\.\d{3}", signal.locator("td.credited").inner_text())
        advantage, trained = (
            signal.locator("td.advantage").inner_text(),
            signal.locator("td.trained").inner_text(),
        )
        if has_signal:  # a group whose rewards differ trains every sample's call
            assert re.fullmatch(r"-?\d+\.\d{3}", advantage) and trained == "yes"
        else:
            assert advantage == "none (not trained)" and trained.startswith("no: ")
        assert signal.get_by_text("tokens (prompt / completion)").is_visible()
        assert call.locator(".message .who").first.inner_text().lower() == "user"
        assert "Name a colour number" in call.locator(".message pre").first.inner_text()
    assert errors == []


@pytest.mark.slow  # the module's one short training
def test_a_filter_narrows_the_groups(trained_run: tuple[Path, str], browser: Any) -> None:
    run_dir, _ = trained_run
    with serve_explorer(run_dir) as server, page_of(browser) as (page, errors):
        page.goto(server.url + "step/1")
        assert page.locator("section.group").count() == 2
        task = page.locator("section.group header .task").nth(1).inner_text()
        question = json.loads(task)["question"]
        page.fill("input[name=q]", question)
        page.click("form.filters button[type=submit]")
        page.wait_for_url(re.compile(r"q="))
        assert page.locator("section.group").count() == 1
        assert question in page.locator("section.group header .task").inner_text()
        page.fill("input[name=q]", "no task says this")
        page.click("form.filters button[type=submit]")
        page.wait_for_selector("p.empty")
        assert page.locator("section.group").count() == 0
    assert errors == []


def test_a_logged_step_appears_on_the_open_page_without_a_reload(tmp_path: Path, browser: Any) -> None:
    run_dir = synthetic_run(tmp_path / "run", steps=2, tasks_per_step=2, group_size=2)
    with serve_explorer(run_dir) as server, page_of(browser) as (page, errors):
        page.goto(server.url)
        page.wait_for_selector("figure[data-chart='reward'] circle[data-step='2']")
        page.evaluate("window.__same_page = true")
        with (run_dir / "metrics.jsonl").open("a") as metrics:  # as the trainer's MetricsWriter appends
            metrics.write(json.dumps({"step": 3, "time": time.time(), "reward_mean": 0.25}) + "\n")
        page.wait_for_selector("figure[data-chart='reward'] circle[data-step='3']", timeout=30_000)
        assert page.locator("#last-step").inner_text() == "3"
        page.wait_for_selector("table.steps a.step-link[href='step/3']")  # the steps table follows too
        assert page.evaluate("window.__same_page") is True  # the same document: no reload
        assert errors == []
        server.stop()  # the viewer goes away: the page says so instead of going quiet
        page.wait_for_selector("#poll-problem:not([hidden])", timeout=30_000)
        assert "Lost contact with the explorer" in page.locator("#poll-problem").inner_text()
        assert page.locator("figure[data-chart='reward'] circle[data-step='3']").count() >= 1  # kept


@pytest.mark.slow  # the module's one short training
def test_the_report_file_shows_the_same_group(trained_run: tuple[Path, str], browser: Any) -> None:
    from playwright.sync_api import expect

    run_dir, _ = trained_run
    report = write_snapshot(run_dir)
    with serve_explorer(run_dir) as server, page_of(browser) as (page, errors):
        page.goto(server.url + "step/2")
        live = page.locator("section.group").first
        live_task = live.locator("header .task").inner_text()
        live_rewards = live.locator(".sample .reward").all_inner_texts()
        page.goto(report.as_uri() + "#step-2")
        page.wait_for_selector("section#step-2:not([hidden]) section.group")
        shown = page.locator("section.view:not([hidden]) section.group").first
        assert shown.locator("header .task").inner_text() == live_task
        assert shown.locator(".sample .reward").all_inner_texts() == live_rewards
        shown.locator("a.sample").first.click()  # its episode, inside the same file
        expect(page.locator("section.view:not([hidden]) h1")).to_have_text("Episode of solver")
        page.goto(report.as_uri())
        page.wait_for_selector("section#run figure[data-chart='reward'] circle")
    assert errors == []


def test_recorded_script_and_links_never_run(tmp_path: Path, browser: Any) -> None:
    run_dir = synthetic_run(tmp_path / "run", steps=1, tasks_per_step=2, group_size=2, hostile=True)
    report = write_snapshot(run_dir)
    with serve_explorer(run_dir) as server, page_of(browser) as (page, errors):
        for address in (server.url, server.url + "step/1", server.url + "held-out"):
            page.goto(address)
            assert page.evaluate("window.__pwned") is None
        page.goto(server.url + "step/1")
        shown_task = page.locator("section.group header .task").first.inner_text()
        assert "<script>window.__pwned = 1</script>" in shown_task  # shown, as text
        page.locator("a.sample").first.click()
        page.wait_for_selector("details.call")
        for summary in page.locator("details summary").all():
            summary.click()  # every call and the metadata open
        assert page.evaluate("window.__pwned") is None
        shown = page.locator("body").inner_text()
        assert (
            shown.count("<script>window.__pwned = 1</script>") >= 5
        )  # task, messages, tool args, output, ...
        hrefs = page.eval_on_selector_all("a", "links => links.map(link => link.getAttribute('href'))")
        assert not [href for href in hrefs if href and href.lower().startswith("javascript:")]
        page.goto(report.as_uri() + "#step-1")
        assert page.evaluate("window.__pwned") is None
    assert errors == []
