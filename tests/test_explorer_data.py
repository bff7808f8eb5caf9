"""The run explorer's data layer and routes, without a browser: read-only SQLite, clear refusals, the live
metrics, groups and filters, held-out rows, escaping, the key, the command line and the snapshot.

Run folders are written by the run folder's own writers (`tests/fixtures/explorer_runs.py`)."""

from __future__ import annotations

import json
import re
import socket
import sqlite3
from pathlib import Path
from urllib.parse import urljoin

import pytest
from fastapi.testclient import TestClient

from lightning_sdk.cli import main
from lightning_sdk.explorer import StoreProblem, write_snapshot
from lightning_sdk.explorer.access import is_loopback
from lightning_sdk.explorer.app import build_app
from lightning_sdk.explorer.episode_views import NOT_RECORDED, call_view, episode_view, group_view
from lightning_sdk.explorer.run_folder import GROUPS_PER_PAGE, MetricsTail, RunSource
from lightning_sdk.explorer.serve import explorer_url
from lightning_sdk.explorer.store_reader import EpisodeFilter, StoreReader
from lightning_sdk.tracing.episode import Episode, LLMCall
from lightning_sdk.tracing.rewards.feedback import Feedback
from lightning_sdk.tracing.store import EpisodeStore
from tests.fixtures.explorer_runs import HOSTILE, synthetic_run, tool_episode

PAGES = ("/", "/step/1", "/step/2", "/held-out", "/held-out?failing=1", "/api/metrics")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthetic_run(
        tmp_path_factory.mktemp("explorer") / "run", steps=3, tasks_per_step=3, group_size=4, eval_every=2
    )


def _fingerprint(path: Path) -> tuple[int, bytes]:
    return path.stat().st_mtime_ns, path.read_bytes()


def test_every_page_reads_and_leaves_the_run_folder_as_it_was(run_dir: Path) -> None:
    files = {path: _fingerprint(path) for path in run_dir.iterdir() if path.is_file()}
    client = TestClient(build_app(run_dir), base_url="http://127.0.0.1")
    step_page = client.get("/step/2").text
    relative = re.findall(r'href="(\.\./episode/training/[0-9a-f]+)"', step_page)
    episode_links = [urljoin("/step/2", link) for link in relative]
    assert len(episode_links) == 12  # 3 groups of 4 samples
    for url in (*PAGES, episode_links[0]):
        assert client.get(url).status_code == 200, url
    assert {path: _fingerprint(path) for path in files} == files
    assert sorted(path.name for path in run_dir.iterdir()) == sorted(path.name for path in files)


def test_a_writer_is_not_blocked_while_the_viewer_reads(tmp_path: Path) -> None:
    path = tmp_path / "episodes.sqlite"
    with EpisodeStore(path) as store:
        store.add_many(Episode(name="a", task=index) for index in range(50))
        reader = StoreReader(path)
        # A read in progress: the statement holds its snapshot of the file until it is finished.
        cursor = reader._connection.execute("SELECT data FROM episodes")
        assert cursor.fetchone() is not None
        # A writer that would fail at once on any lock: no waiting allowed.
        writer = sqlite3.connect(path, timeout=0, isolation_level=None)
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("UPDATE episodes SET reward = 1.0")
        writer.execute("COMMIT")
        writer.close()
        store.add(Episode(name="after", task=99))  # the trainer's own writer too
        assert len(cursor.fetchall()) == 49  # the reader's snapshot was not disturbed
        assert len(reader.refresh()) == 51  # and the next request sees the new rows
        reader.close()


def test_the_reader_refuses_to_write(tmp_path: Path) -> None:
    path = tmp_path / "episodes.sqlite"
    with EpisodeStore(path) as store:
        store.add(Episode(name="a"))
    reader = StoreReader(path)
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        reader._connection.execute("DELETE FROM episodes")
    reader.close()


def test_missing_corrupt_foreign_and_newer_stores_get_a_clear_message(tmp_path: Path) -> None:
    with pytest.raises(StoreProblem, match="No episode store at"):
        StoreReader(tmp_path / "missing.db")
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreProblem, match="not a readable episode store"):
        StoreReader(corrupt)
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as connection:
        connection.execute("CREATE TABLE things (x)")
    with pytest.raises(StoreProblem, match="not an episode store"):
        StoreReader(foreign)
    newer = tmp_path / "newer.db"
    with EpisodeStore(newer) as store:
        store.add(Episode(name="a"))
    with sqlite3.connect(newer) as connection:
        connection.execute("PRAGMA user_version = 99")
    before = _fingerprint(newer)
    with pytest.raises(StoreProblem, match="newer lightning-sdk"):
        StoreReader(newer)
    assert _fingerprint(newer) == before
    with pytest.raises(StoreProblem, match="not a run folder"):
        RunSource(tmp_path / "no-run")


def test_the_index_follows_appends_and_a_resumed_run_dropping_steps(tmp_path: Path) -> None:
    path = tmp_path / "episodes.sqlite"
    with EpisodeStore(path) as store:
        store.add_many(Episode(name="a", run_id="r", metadata={"step": step}) for step in (1, 1, 2, 2))
        reader = StoreReader(path)
        assert [row.step for row in reader.refresh()] == [1, 1, 2, 2]
        store.add(Episode(name="a", run_id="r", metadata={"step": 3}))
        assert [row.step for row in reader.refresh()] == [1, 1, 2, 2, 3]
        store.discard_steps_after("r", 1)
        assert [row.step for row in reader.refresh()] == [1, 1]
        reader.close()


def test_metrics_are_read_as_they_are_appended_and_a_torn_line_waits(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    tail = MetricsTail(path)
    assert tail.read() == []
    path.write_text('{"step": 1, "reward_mean": 0.5}\n{"step": 2, "rew')
    assert [record["step"] for record in tail.read()] == [1]
    with path.open("a") as file:
        file.write('ard_mean": 0.7}\n')
    assert [record["reward_mean"] for record in tail.read()] == [0.5, 0.7]
    path.write_text('{"step": 1, "reward_mean": 0.1}\n')  # rewritten shorter, as a resume does
    assert [record["reward_mean"] for record in tail.read()] == [0.1]


def test_a_group_without_a_reward_spread_says_why_it_gave_no_signal() -> None:
    def scored(value: float | None, sample: int) -> Episode:
        episode = Episode(name="a", task="t", metadata={"task_index": 0, "sample": sample})
        if value is not None:
            episode.rewards["r"] = value
        return episode

    alike = group_view([scored(1.0, 0), scored(1.0, 1)], 1.0)
    assert alike["skipped"] is not None and "no reward spread" in alike["skipped"]
    assert "fewer than two" in (group_view([scored(1.0, 0), scored(None, 1)], 1.0)["skipped"] or "")
    spread = group_view([scored(1.0, 1), scored(0.0, 0)], 1.0)
    assert spread["skipped"] is None
    assert [sample["sample"] for sample in spread["samples"]] == [0, 1]
    assert [sample["failed"] for sample in spread["samples"]] == [True, False]


def test_a_call_shows_its_training_signal_when_recorded_and_says_so_when_not() -> None:
    owner = Episode(name="solver")
    bare = call_view(LLMCall(agent_name="solver"), owner, 0)
    assert bare["credited_reward"] == bare["advantage"] == NOT_RECORDED
    assert bare["trained"].startswith(NOT_RECORDED) and "no token ids" in bare["trained"]
    credited = LLMCall(
        agent_name="writer",
        prompt_token_ids=[1, 2, 3],
        completion_token_ids=[4],
        metadata={
            "credited_reward": 0.75,
            "advantage": -0.5,
            "trained": False,
            "untrained_reason": "too long",
        },
    )
    view = call_view(credited, owner, 1)
    assert (view["credited_reward"], view["advantage"], view["trained"]) == (
        "0.750",
        "-0.500",
        "no: too long",
    )
    assert (view["prompt_tokens"], view["completion_tokens"], view["role"]) == (3, 1, "writer")
    skipped = LLMCall(
        metadata={
            "credit_rule": "equal",
            "credited_reward": 1.0,
            "trained": False,
            "untrained_reason": "no_spread",
        }
    )
    view = call_view(skipped, owner, 2)
    assert (view["advantage"], view["trained"], view["credit_rule"]) == (
        "none (not trained)",
        "no: no_spread",
        "equal",
    )
    stepped = LLMCall(
        metadata={"advantage": 0.5, "episode_advantage": 0.2, "step_advantage": 0.3, "step_group_size": 3}
    )
    assert (
        call_view(stepped, owner, 3)["step_parts"]
        == "episode part 0.200, step part 0.300 (a step group of 3 calls)"
    )
    valued = LLMCall(metadata={**stepped.metadata, "episode_advantage": 0.0, "step_estimate": "state_value"})
    assert call_view(valued, owner, 3)["step_parts"] == (
        "episode part 0.000, step part 0.300 (a step group of 3 calls, valued by the state it led to)"
    )


def test_groups_filter_sort_and_page(tmp_path: Path) -> None:
    run = synthetic_run(tmp_path / "run", steps=1, tasks_per_step=GROUPS_PER_PAGE + 5, group_size=2, seed=3)
    source = RunSource(run)
    everything = source.step_groups(1, EpisodeFilter())
    assert everything["group_count"] == GROUPS_PER_PAGE + 5 and len(everything["groups"]) == GROUPS_PER_PAGE
    assert len(source.step_groups(1, EpisodeFilter(), page=1)["groups"]) == 5
    one = source.step_groups(1, EpisodeFilter(text="What is 3 + 10"))
    assert [group["task_index"] for group in one["groups"]] == [3]
    worst = source.step_groups(1, EpisodeFilter(), sort="worst")["groups"]
    means = [group["mean_value"] for group in worst]
    assert means == sorted(means)
    failed = source.step_groups(1, EpisodeFilter(max_reward=0.0))
    assert all(sample["reward"] == "0.000" for group in failed["groups"] for sample in group["samples"])
    assert source.step_groups(1, EpisodeFilter(agent="nobody"))["group_count"] == 0
    source.close()


def test_held_out_puts_each_task_before_and_after_side_by_side(run_dir: Path) -> None:
    source = RunSource(run_dir)
    view = source.held_out()
    assert view["steps"] == [0, 2, 3]
    assert [row["task_index"] for row in view["rows"]] == [0, 1, 2, 3]
    assert all(len(row["results"]) == 3 and all(row["results"]) for row in view["rows"])
    failing = source.held_out(failing_only=True)
    assert all(row["results"][-1]["failed"] for row in failing["rows"])
    source.close()


def test_recorded_text_is_escaped_on_every_page(tmp_path: Path) -> None:
    run = synthetic_run(tmp_path / "run", steps=1, tasks_per_step=2, group_size=2, hostile=True)
    client = TestClient(build_app(run), base_url="http://127.0.0.1")
    pages = [client.get(url).text for url in PAGES if url != "/step/2"]
    step_page = pages[1]
    episode_url = urljoin("/step/1", re.findall(r'href="(\.\./episode/training/[0-9a-f]+)"', step_page)[0])
    pages.append(client.get(episode_url).text)
    pages.append(write_snapshot(run).read_text())
    for page in pages:
        assert "<script>window" not in page and "<img src=x" not in page
        assert 'href="javascript:' not in page
    episode_page = pages[-2]
    assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in episode_page  # shown, as text


def test_beyond_this_machine_every_request_needs_the_key(run_dir: Path) -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.5")
    local = TestClient(build_app(run_dir), base_url="http://127.0.0.1")
    assert local.get("/", headers={"host": "localhost:8765"}).status_code == 200
    assert local.get("/", headers={"host": "[::1]:8765"}).status_code == 200
    # A page elsewhere that points its own name at 127.0.0.1 (DNS rebinding) is refused.
    assert local.get("/api/metrics", headers={"host": "attacker.example:8765"}).status_code == 421
    client = TestClient(build_app(run_dir, key="secret-key"), base_url="http://127.0.0.1")
    assert client.get("/").status_code == 401
    assert client.get("/api/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/api/metrics", headers={"Authorization": "Bearer secret-key"}).status_code == 200
    assert client.get("/api/metrics", headers={"x-api-key": "secret-key"}).status_code == 200
    assert client.get("/?key=secret-key").status_code == 200  # the printed address; the cookie keeps it
    assert client.get("/step/1").status_code == 200


def test_the_printed_address_works_for_any_key_and_leaves_no_key_behind(run_dir: Path) -> None:
    key = "a+b&c#d e/f"  # a chosen key with characters that mean something in a URL
    url = explorer_url("0.0.0.0", 8765, key)
    assert url == "http://127.0.0.1:8765/?key=a%2Bb%26c%23d%20e%2Ff"
    client = TestClient(build_app(run_dir, key=key, port=8765), base_url="http://127.0.0.1:8765")
    first = client.get("/step/1?sort=reward&key=" + url.split("key=")[1], follow_redirects=False)
    # The key is kept in a cookie named after the port, and the browser is sent to the same address
    # without it: the key stays out of the address bar and the history.
    assert (
        first.status_code == 303 and first.headers["location"] == "http://127.0.0.1:8765/step/1?sort=reward"
    )
    assert "lightning_sdk_view_key_8765=" in first.headers["set-cookie"]
    assert "HttpOnly" in first.headers["set-cookie"]
    assert client.get(first.headers["location"]).status_code == 200  # the cookie carries the key now
    # Another explorer on this host (another port) neither reads nor overwrites this one's cookie.
    other = TestClient(build_app(run_dir, key="other", port=8766), base_url="http://127.0.0.1:8766")
    other.cookies.set("lightning_sdk_view_key_8765", key)
    assert other.get("/").status_code == 401


def test_behind_a_path_prefix_every_link_stays_under_it(run_dir: Path) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    proxy = Starlette(routes=[Mount("/explorer", app=build_app(run_dir))])
    client = TestClient(proxy, base_url="http://127.0.0.1")
    for page in ("/explorer/", "/explorer/step/2", "/explorer/held-out"):
        html = client.get(page).text
        targets = re.findall(r'(?:href|src|data-poll)="([^"#]+)"', html)
        assert targets and not [t for t in targets if t.startswith("/")], (page, targets)  # none absolute
        for target in targets:
            address = urljoin("http://127.0.0.1" + page, target.replace("&amp;", "&"))
            assert address.startswith("http://127.0.0.1/explorer/"), (page, target)
            assert client.get(address).status_code == 200, (page, target)


def test_error_pages_are_titled_by_what_went_wrong(tmp_path: Path) -> None:
    run_dir = synthetic_run(tmp_path / "run", steps=1, tasks_per_step=2, group_size=2)  # broken below
    client = TestClient(build_app(run_dir), base_url="http://127.0.0.1")
    missing = client.get("/episode/training/nope")
    assert missing.status_code == 404 and "<title>not found" in missing.text
    assert 'href="../../static/explorer.css"' in missing.text  # its links are relative to it, too
    (run_dir / "evaluations.sqlite").write_bytes(b"\0" * 4096)  # the file is no SQLite database any more
    broken = client.get("/held-out")
    assert broken.status_code == 500 and "<title>internal server error" in broken.text


def test_a_production_store_lists_filters_and_shows_feedback(tmp_path: Path) -> None:
    import random

    path = tmp_path / "episodes.db"
    rng = random.Random(0)
    with EpisodeStore(path) as store:
        episodes = [
            tool_episode({"question": f"q{index}", "expression": f"{index} + 1"}, index % 2 == 0, rng)
            for index in range(6)
        ]
        store.add_many(episodes)
        store.add_feedback(episodes[1].id, Feedback(reward=1.0, name="thumbs", comment=HOSTILE))
    client = TestClient(build_app(store=path), base_url="http://127.0.0.1")
    listing = client.get("/").text
    assert "6 episode(s) match" in listing
    assert "1 episode(s) match" in client.get("/", params={"q": "q3"}).text
    assert (
        "2 episode(s) match" in client.get("/", params={"max": "0"}).text
    )  # 1, 3, 5 failed; 1 got +1 feedback
    page = client.get(f"/episode/store/{episodes[1].id}").text
    assert "thumbs" in page and "&lt;script&gt;" in page and "<script>window" not in page
    assert "advantage</th>" not in page.split("Calls")[0]  # no step, no advantage for production traces
    assert client.get("/step/1").status_code == 404


def test_the_command_line_refuses_bad_input_with_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["view"]) == 2
    assert "one of the two" in capsys.readouterr().err
    assert main(["view", str(tmp_path / "missing")]) == 2
    assert "not a run folder" in capsys.readouterr().err
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"\0" * 4096)
    assert main(["view", "--store", str(corrupt), "--port", "0"]) == 2
    assert "episode store" in capsys.readouterr().err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        run = synthetic_run(tmp_path / "run", steps=1, tasks_per_step=1, group_size=2)
        assert main(["view", str(run), "--port", str(port)]) == 2
    assert f"Cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err  # and what to do
    # An empty key would let an empty header in beyond this machine.
    assert main(["view", str(run), "--host", "0.0.0.0", "--port", "0", "--key", ""]) == 2
    assert "key is empty" in capsys.readouterr().err


def test_the_snapshot_stays_within_its_size_and_says_what_it_left_out(run_dir: Path, tmp_path: Path) -> None:
    assert main(["report", str(run_dir)]) == 0
    whole = (run_dir / "report.html").read_text()
    assert whole.count('<section class="view" id="episode-') == 3 * 12 + 3 * 4  # every step and evaluation
    small = write_snapshot(run_dir, tmp_path / "small.html", max_mb=0.02).read_text()
    assert "not in this snapshot" in small
    assert small.count('id="episode-') < whole.count('id="episode-')
    data = json.loads(re.search(r'id="charts-data">(.*?)</script>', whole, re.S).group(1))  # type: ignore[union-attr]
    assert {chart["id"] for chart in data} >= {"reward", "held_out", "signal", "time"}


def test_the_warnings_a_run_logged_are_kept_and_shown(tmp_path: Path) -> None:
    import logging

    from lightning_sdk.training.records.run_warnings_file import keep_warnings, read_warnings

    run = synthetic_run(tmp_path / "run", steps=1, tasks_per_step=1, group_size=2)
    with keep_warnings(run):
        logging.getLogger("lightning_sdk.training").warning(
            "Step %d: %s", 1, f"a route selected no call {HOSTILE}"
        )
        logging.getLogger("lightning_sdk.training").info("not a warning")
    logging.getLogger("lightning_sdk.training").warning("after the run")
    assert [record["message"] for record in read_warnings(run)] == [
        f"Step 1: a route selected no call {HOSTILE}"
    ]
    page = TestClient(build_app(run), base_url="http://127.0.0.1").get("/").text
    assert "Step 1: a route selected no call &lt;script&gt;" in page


def test_a_long_runs_snapshot_shows_the_newest_steps_and_a_spread_of_the_rest(tmp_path: Path) -> None:
    run = synthetic_run(tmp_path / "run", steps=12, tasks_per_step=1, group_size=2)
    page = write_snapshot(run, newest_steps=3, sampled_steps=2).read_text()
    sections = [int(step) for step in re.findall(r'<section class="view" id="step-(\d+)">', page)]
    assert sections[:3] == [12, 11, 10] and len(sections) == 5 and min(sections) < 10
    linked = {int(step) for step in re.findall(r'class="step-link" href="#step-(\d+)"', page)}
    assert linked == set(sections)  # a step left out is listed, not linked to a section that is not there
    left_out = sorted(set(range(1, 13)) - linked)
    assert len(left_out) == 7 and all(f"<td>step {step}</td>" in page for step in left_out)


def test_a_call_that_continues_an_earlier_conversation_shows_only_what_is_new() -> None:
    import random

    episode = tool_episode({"question": "q", "expression": "1 + 2"}, True, random.Random(0))
    first, second = episode_view(episode)["calls"]
    assert [m["role"] for m in first["messages"]] == ["user"] and first["earlier"] is None
    # The second call was sent the first call's question, its tool call and the tool's result.
    assert [m["role"] for m in second["messages"]] == ["assistant", "tool"]
    assert second["earlier"] == {"count": 1, "call": 1}
    assert second["messages"][1]["text"] == "3"


def test_the_command_serves_and_a_trainers_viewer_stops_with_its_with_block(run_dir: Path) -> None:
    import subprocess
    import sys
    import urllib.request

    from lightning_sdk.training.records.live_view import live_view

    command = [sys.executable, "-m", "lightning_sdk.cli", "view", str(run_dir), "--port", "0"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as viewer:
        try:
            line = viewer.stdout.readline() if viewer.stdout else ""
            url = re.search(r"Run explorer: (http://127\.0\.0\.1:\d+/)", line)
            assert url is not None, line
            with urllib.request.urlopen(url.group(1), timeout=60) as response:
                assert response.status == 200 and "Steps" in response.read().decode()
        finally:
            viewer.terminate()
    with live_view(run_dir, True) as view:
        assert view is not None
        with urllib.request.urlopen(view.url + "api/metrics", timeout=60) as response:
            assert json.loads(response.read())["count"] > 0
    assert view.process.poll() is not None  # stopped with the block
    with live_view(run_dir, False) as nothing:
        assert nothing is None


def test_a_trainers_viewer_exits_when_the_trainer_dies_without_stopping_it(run_dir: Path) -> None:
    import subprocess
    import sys
    import time

    script = (
        "import os, sys; from pathlib import Path;"
        "from lightning_sdk.training.records.live_view import LiveView;"
        f"view = LiveView.start(Path({str(run_dir)!r})); print(view.process.pid, flush=True); os._exit(0)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    pid = int(done.stdout.split()[-1])

    def running() -> bool:
        status = Path(f"/proc/{pid}/status")
        return status.exists() and "\nState:\tZ" not in status.read_text()

    deadline = time.monotonic() + 60  # a bound, not a timing claim: it checks its parent every half second
    while running() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running()


def test_a_huge_tool_result_is_cut_on_the_page_and_says_how_much() -> None:
    from lightning_sdk.explorer.episode_views import TEXT_LIMIT

    call = LLMCall(messages=[{"role": "tool", "tool_call_id": "c", "content": "x" * (TEXT_LIMIT + 5)}])
    (message,) = call_view(call, Episode(name="a"), 0)["messages"]
    assert message["text"].endswith("(5 more characters not shown)")
    assert len(message["text"]) < TEXT_LIMIT + 100


def test_the_run_page_charts_step_level_credit_when_the_run_used_it() -> None:
    from lightning_sdk.explorer.run_folder import charts

    step = {"step": 1, "reward_mean": 0.5, "step_group_share": 0.25}
    step.update(advantage_episode_abs_mean=0.8, advantage_step_abs_mean=0.3)
    [credit] = [chart for chart in charts([step]) if chart["id"] == "credit"]
    assert {series["name"]: series["points"] for series in credit["series"]} == {
        "share of calls in a step group": [(1, 0.25)],
        "mean |episode advantage|": [(1, 0.8)],
        "mean |step advantage|": [(1, 0.3)],
    }
    assert "credit" not in {chart["id"] for chart in charts([{"step": 1, "reward_mean": 0.5}])}


def test_the_run_page_charts_rollouts_through_the_update_and_the_capped_share_by_age() -> None:
    from lightning_sdk.explorer.run_folder import charts

    step = {"step": 2, "reward_mean": 0.5, "groups_staleness_0": 3.0, "groups_staleness_1": 1.0}
    step.update(groups_too_old=1.0, groups_in_flight=4, importance_capped_fraction_s0=0.0)
    step.update(importance_capped_fraction_s1=0.125)
    drawn = {chart["id"]: chart for chart in charts([step])}
    assert {series["name"]: series["points"] for series in drawn["capped_by_staleness"]["series"]} == {
        "0 update(s) old": [(2, 0.0)],
        "1 update(s) old": [(2, 0.125)],
    }
    assert {series["name"] for series in drawn["staleness"]["series"]} == {
        "trained, 0 update(s) old",
        "trained, 1 update(s) old",
        "too old (left out)",
        "running through the update",
    }
    step_by_step = {chart["id"] for chart in charts([{"step": 1, "reward_mean": 0.5}])}
    assert "capped_by_staleness" not in step_by_step and "staleness" not in step_by_step


def test_the_run_summary_says_how_the_run_went_and_survives_a_run_that_failed() -> None:
    from lightning_sdk.explorer.run_summary import summary

    records = [{"step": 0, "val_reward": 0.0}]
    for step, reward in enumerate([0.0, 1.0, 0.0, 1.0, 0.5, 0.5], start=1):
        records.append({"step": step, "reward_mean": reward, "groups_rolled_out": 4, "groups_with_signal": 2})
    records.append({"step": 6, "val_reward": 0.5, "best_step": 6})
    rows = dict(summary(records))
    assert rows["steps trained"] == "6" and rows["held-out reward, first → last"] == "0.000 → 0.500"
    # The moving average of 5 steps goes from the first step's 0.000 to mean(1, 0, 1, .5, .5) = 0.600.
    assert rows["training reward, moving average of 5 steps, first → last"] == "0.000 → 0.600"
    assert rows["groups with a learning signal (mean over steps)"] == "50%"
    assert rows["best held-out reward (the run's adapter: best_adapter/)"] == "0.500 at step 6"
    failed = dict(
        summary([{"step": 0, "val_reward": None}, {"step": 1, "reward_mean": None, "episodes_failed": 8}])
    )
    assert failed["held-out reward, first → last"] == "n/a → n/a" and failed["steps trained"] == "1"


def test_the_run_page_shows_the_gap_between_engine_and_trainer() -> None:
    from lightning_sdk.explorer.run_folder import charts
    from lightning_sdk.explorer.run_summary import summary

    records = [
        {"step": step, "reward_mean": 0.5, "mismatch_logratio_abs": gap, "mismatch_tail_share": 0.0}
        for step, gap in enumerate([0.015, 0.053, 0.002], start=1)
    ]
    row = next(value for what, value in summary(records) if what.startswith("engine against trainer"))
    assert row == "0.0150 (2 of 3)"  # the median step, and how many steps were above 0.005
    drawn = {chart["id"]: chart for chart in charts(records)}
    assert drawn["policy_gap"]["series"][0]["points"] == [(1, 0.015), (2, 0.053), (3, 0.002)]
    assert "policy_gap" not in {chart["id"] for chart in charts([{"step": 1, "reward_mean": 0.5}])}


def test_warnings_are_kept_after_the_engine_closes_every_logging_handler(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # vLLM's logging set-up (dictConfig, when its engine starts inside the run) closes every handler in the
    # process: the warnings file must keep taking lines after that, without a "Logging error".
    import logging

    from lightning_sdk.training.records.run_warnings_file import keep_warnings, read_warnings

    run = synthetic_run(tmp_path / "run", steps=1, tasks_per_step=1, group_size=2)
    logger = logging.getLogger("lightning_sdk.training")
    with keep_warnings(run):
        logger.warning("before the engine starts")
        for handler in logging.getLogger("lightning_sdk").handlers:
            handler.close()  # what logging.shutdown, called by dictConfig, does to each
        logger.warning("memory bound: after the engine started")
    assert [record["message"] for record in read_warnings(run)] == [
        "before the engine starts",
        "memory bound: after the engine started",
    ]
    assert "Logging error" not in capsys.readouterr().err
