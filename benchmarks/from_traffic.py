"""Learning from traffic, measured on the quickstart: what `benchmarks/learning.py` runs for two of its rows.

- `quickstart_distilled`: a teacher (the quickstart's trained adapter, trained once with seed 100 and
  kept in runs/learning/teacher) is served by `lightning-sdk serve` and answers the seed's training
  problems while `ls.configure(store=...)` records them, as production traffic would be recorded; the
  base model is then trained on the teacher's rewarded episodes (`Trainer.fit_sft`), and GRPO starts from
  that adapter (`TrainerConfig(init_adapter=...)`) with the quickstart's settings (its learning rate
  times `warm_start_lr_scale`, an eighth by default) and a time budget of GRPO alone's training time
  minus the SFT's, so both arms train for the same time. The run's first evaluation is the SFT adapter
  alone.
- `quickstart_judged`: the quickstart trained with no reward function: the agent records no reward,
  and the bundled base model, served by `lightning-sdk serve`, judges each group of attempts
  (`ls.Judge`, shown the question only); held-out problems are scored with the true answer
  (`fit(val_reward=...)`). The judge's agreement with the true reward is read from the groups it scored.

    python benchmarks/learning.py --only quickstart_distilled quickstart_judged --seeds 0 1 2
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import combinations
from pathlib import Path
from typing import Any

import lightning_sdk as ls

ROOT = Path(__file__).resolve().parents[1]
TEACHER_DIR = ROOT / "runs" / "learning" / "teacher"
TEACHER_SEED = 100
TEACHER_TASKS = 160
"""Training problems the teacher answers per seed: at its ~50% that leaves ~80 rewarded episodes."""
WEAK_TEACHER_TASKS = 16
"""The weaker warm start's share (`distilled_small`): about a tenth of the full arm's episodes."""
GRPO_ALONE_TRAINING_S = {0: 284.0, 1: 342.9, 2: 322.3}
"""GRPO alone's training time per seed (the token-budget quickstart rows of benchmarks/results/learning),
the budget the distilled arm's SFT and GRPO share."""
SFT = {"learning_rate": 2e-4, "batch_size": 1, "group_size": 8, "epochs": 2}
"""8 samples per SFT step: ~80 episodes give ~10 steps per epoch."""
RUBRIC = (
    "The task is an arithmetic word problem. An attempt is better when its final number is the correct "
    "answer to the problem. An attempt with no number, an error message or a wrong number is worse."
)


# --- distillation ------------------------------------------------------------------------------------------
def distilled_small(seed: int, run_dir: Path, **options: Any) -> dict[str, Any]:
    """`distilled` with a weaker warm start: SFT on the teacher's answers to `WEAK_TEACHER_TASKS` problems
    only (about a tenth of the rewarded episodes), so that SFT alone ends well below the full arm."""
    return distilled(seed, run_dir, teacher_tasks=WEAK_TEACHER_TASKS, **options)


def distilled(seed: int, run_dir: Path, teacher_tasks: int | None = None, **options: Any) -> dict[str, Any]:
    """Teacher traffic -> SFT -> GRPO for one seed; the summary of `run_quickstart` plus the phases."""
    from lightning_sdk.examples.calc_autogen.data import train_test_split
    from lightning_sdk.quickstart import QUICKSTART, run_quickstart

    teacher = train_teacher()
    train_tasks, _ = train_test_split(400, QUICKSTART["test_size"], seed=seed)
    store_path = run_dir / "teacher_traffic.sqlite"
    started = time.perf_counter()
    recorded = record_traffic(teacher, train_tasks[: teacher_tasks or TEACHER_TASKS], store_path, seed)
    record_s = time.perf_counter() - started

    started = time.perf_counter()
    config = ls.TrainerConfig(
        run_dir=str(run_dir / "sft"),
        seed=seed,
        learning_rate=SFT["learning_rate"],
        batch_size=SFT["batch_size"],
        group_size=SFT["group_size"],
        progress_bar=False,
    )
    with ls.EpisodeStore(store_path) as store:
        sft = ls.Trainer(config=config).fit_sft(store, min_reward=1.0, epochs=SFT["epochs"])
    sft_s = time.perf_counter() - started

    budget_s = max(60.0, GRPO_ALONE_TRAINING_S.get(seed, 300.0) - sft_s)
    summary = run_quickstart(
        seed=seed, run_dir=run_dir, init_adapter=str(sft.adapter_path), max_time_s=budget_s, **options
    )
    summary["extra"] = {
        "teacher": str(teacher),
        "teacher_episodes": recorded["episodes"],
        "teacher_solved": recorded["solved"],
        "teacher_record_s": round(record_s, 1),
        "sft_samples": sft.samples,
        "sft_steps": sft.steps,
        "sft_loss": [round(sft.first_loss, 4), round(sft.last_loss, 4)],
        "sft_s": round(sft_s, 1),
        "grpo_budget_s": round(budget_s, 1),
        "sft_alone_held_out": summary["base_reward"],
    }
    return summary


def train_teacher() -> Path:
    """The teacher's adapter: the quickstart trained once with seed 100 (kept, so every seed and every
    later sweep uses the same teacher)."""
    from lightning_sdk.quickstart import run_quickstart

    adapter = TEACHER_DIR / "adapter"
    if not (adapter / "adapter_config.json").exists():
        print(f"    training the teacher (quickstart, seed {TEACHER_SEED}) into {TEACHER_DIR}", flush=True)
        summary = run_quickstart(seed=TEACHER_SEED, run_dir=TEACHER_DIR, report=False, curve_to=None)
        (TEACHER_DIR / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return adapter


def record_traffic(adapter: Path, tasks: list[dict[str, Any]], store_path: Path, seed: int) -> dict[str, int]:
    """Serve the teacher and run the (unchanged) agent on `tasks` with recording on, as in production."""
    from lightning_sdk.examples.calc_autogen.agent import solve

    with served(adapter=adapter) as (base_url, api_key):
        os.environ.update(OPENAI_BASE_URL=base_url, OPENAI_API_KEY=api_key, OPENAI_MODEL="default")
        ls.configure(store=str(store_path), run_id=f"teacher-seed{seed}")
        try:
            asyncio.run(_run_all(solve, tasks, concurrency=8))
        finally:
            ls.configure(store=None)
            for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_MODEL"):
                os.environ.pop(name, None)
    with ls.EpisodeStore(store_path) as store:
        episodes = store.episodes()
    return {"episodes": len(episodes), "solved": sum(1 for e in episodes if (e.reward or 0.0) >= 1.0)}


async def _run_all(agent: Any, tasks: list[dict[str, Any]], concurrency: int) -> None:
    gate = asyncio.Semaphore(concurrency)

    async def one(task: dict[str, Any]) -> None:
        async with gate:
            await agent(task)

    await asyncio.gather(*(one(task) for task in tasks))


# --- judged rewards ----------------------------------------------------------------------------------------
def judged(seed: int, run_dir: Path, **options: Any) -> dict[str, Any]:
    """The quickstart trained on a judge's rewards; held-out scored with the true answer."""
    from lightning_sdk.examples.calc_autogen.agent import answer, answer_reward
    from lightning_sdk.quickstart import run_quickstart

    unscored_agent = ls.trace_agent(name="calc_autogen")(answer)
    run_dir.mkdir(parents=True, exist_ok=True)
    with served(adapter=None) as (base_url, api_key):
        judge = QuestionJudge(
            RUBRIC, model="default", base_url=base_url, api_key=api_key, cache_path=run_dir / "judge.sqlite"
        )
        summary = run_quickstart(
            seed=seed,
            run_dir=run_dir,
            agent=unscored_agent,
            group_reward=judge,
            val_reward=answer_reward,
            **options,
        )
    summary["extra"] = {"judge": "bundled SmolLM2-135M-Instruct", **judge_agreement(run_dir)}
    return summary


class QuestionJudge(ls.Judge):
    """Shows the judge the problem's question only: the task also holds the answer, which a judge of real
    traffic would not have."""

    def __call__(self, task: Any, attempts: Any) -> list[float | None]:
        return super().__call__(task["question"], attempts)


def judge_agreement(run_dir: Path) -> dict[str, Any]:
    """How often the judge ordered two attempts of a group as the true reward does: over the pairs of one
    group whose true rewards differ, the share the judge scored the right way round (a tie counts half).
    The judge is not trained, so every group it scored is new to it."""
    from lightning_sdk.examples.calc_autogen.agent import answer_reward

    with ls.EpisodeStore(run_dir / "episodes.sqlite") as store:
        episodes = [e for e in store.episodes() if "judge" in e.rewards]
    groups: dict[tuple[Any, ...], list[tuple[float, float]]] = {}
    for episode in episodes:
        key = (episode.metadata.get("step"), json.dumps(episode.task, sort_keys=True))
        truth = float(answer_reward(episode.task, episode.output) or 0.0)
        groups.setdefault(key, []).append((episode.rewards["judge"], truth))
    agree = pairs = 0.0
    for scored in groups.values():
        for (judge_a, true_a), (judge_b, true_b) in combinations(scored, 2):
            if true_a == true_b:
                continue
            pairs += 1
            if judge_a == judge_b:
                agree += 0.5
            elif (judge_a > judge_b) == (true_a > true_b):
                agree += 1
    right = [judge for scored in groups.values() for judge, truth in scored if truth >= 1.0]
    wrong = [judge for scored in groups.values() for judge, truth in scored if truth < 1.0]
    return {
        "judged_episodes": len(episodes),
        "judged_groups": len(groups),
        "pairs_with_different_truth": int(pairs),
        "pairwise_agreement": round(agree / pairs, 3) if pairs else math.nan,
        "mean_judge_reward_right": round(sum(right) / len(right), 3) if right else math.nan,
        "mean_judge_reward_wrong": round(sum(wrong) / len(wrong), 3) if wrong else math.nan,
    }


# --- a served model in its own process ---------------------------------------------------------------------
@contextmanager
def served(adapter: Path | None) -> Iterator[tuple[str, str]]:
    """`lightning-sdk serve` (the bundled model, with `adapter` when given) on a free port; yields its
    base URL and key, and stops it on exit."""
    port, api_key = free_port(), "bench-key"
    cli = Path(sys.executable).with_name("lightning-sdk")  # the venv's console script
    command = [str(cli), "serve", "--port", str(port), "--api-key", api_key]
    command += ["--adapter", str(adapter)] if adapter is not None else []
    server = subprocess.Popen(command, cwd=ROOT)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", server)
        yield f"http://127.0.0.1:{port}/v1", api_key
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_healthy(url: str, server: subprocess.Popen[bytes], timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the served model exited with code {server.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(2)
    raise TimeoutError(f"{url} was not healthy after {timeout_s:.0f} s")
