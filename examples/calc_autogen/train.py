"""Train the calculator agent on the bundled 135M model: `python examples/calc_autogen/train.py`.

Prints the held-out reward of the base model and of the trained one (greedy decoding), writes the HTML
report in the run folder and copies the validation curve next to this file (`reward_curve.png`).
The defaults are the measured configuration of README.md; `lightning-sdk quickstart` runs a shorter one.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["DEFAULTS", "train"]

HERE = Path(__file__).resolve().parent
DEFAULTS: dict[str, Any] = {
    "steps": 20,
    "batch_size": 4,
    "group_size": 8,
    "learning_rate": 2e-4,
    "temperature": 0.7,
    "train_size": 400,
    "test_size": 64,
    "eval_every": 4,
}
"""The measured configuration (README.md)."""


def train(
    steps: int = DEFAULTS["steps"],
    run_dir: str | Path | None = None,
    *,
    engine: Any = "auto",
    batch_size: int = DEFAULTS["batch_size"],
    group_size: int = DEFAULTS["group_size"],
    learning_rate: float = DEFAULTS["learning_rate"],
    temperature: float = DEFAULTS["temperature"],
    train_size: int = DEFAULTS["train_size"],
    test_size: int = DEFAULTS["test_size"],
    eval_every: int = DEFAULTS["eval_every"],
    seed: int = 0,
    max_time_s: float | None = None,
    report: bool = True,
    curve_to: str | Path | None = None,
    model: str | None = None,
    agent: Callable[..., Any] | None = None,
    group_reward: Callable[[Any, list[Any]], Any] | None = None,
    val_reward: Callable[[Any, Any], float] | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """Train the calculator agent; return base and trained held-out reward, wall time and the run paths.

    Args:
        steps: GRPO steps (each runs `batch_size` problems `group_size` times).
        run_dir: the run folder (default: `runs/<date-time>`).
        engine: `"auto"` or an engine you built (tests pass the session's shared engine).
        seed: seeds the problems (train and held-out sets) and the trainer.
        max_time_s: optional wall-clock budget of the training steps.
        report: write `report.html` (and the curve PNGs) into the run folder.
        curve_to: copy the validation curve PNG there (e.g. `examples/calc_autogen/reward_curve.png`).
        model: `None` for the bundled SmolLM2-135M-Instruct, or a Hugging Face folder or Hub id.
        agent: the agent to train (default: `agent.solve`, which scores itself with `answer_reward`).
        group_reward: a judge scoring each group of attempts (`Trainer.fit(group_reward=...)`).
        val_reward: scores held-out episodes that scored nothing themselves (`Trainer.fit(val_reward=...)`).
        overrides: any other `TrainerConfig` field (e.g. `dynamic_sampling_rounds=2`).
    """
    from lightning_sdk.examples.calc_autogen.agent import MAX_TOKENS, solve
    from lightning_sdk.examples.calc_autogen.data import train_test_split
    from lightning_sdk.examples.results import summarize_fit
    from lightning_sdk.training.config import TrainerConfig
    from lightning_sdk.training.trainer import Trainer

    train_tasks, test_tasks = train_test_split(train_size, test_size, seed=seed)
    config = TrainerConfig(
        group_size=group_size,
        batch_size=batch_size,
        max_steps=steps,
        max_time_s=max_time_s,
        learning_rate=learning_rate,
        temperature=temperature,
        max_tokens=MAX_TOKENS,
        eval_every=eval_every,
        save_every=0,
        run_dir=None if run_dir is None else str(run_dir),
        seed=seed,
        **overrides,
    )
    started = time.perf_counter()
    result = Trainer(model, config=config, engine=engine).fit(
        agent or solve, train_tasks, test_tasks, group_reward=group_reward, val_reward=val_reward
    )
    wall_time_s = time.perf_counter() - started
    return {**summarize_fit(result, report=report, curve_to=curve_to), "wall_time_s": wall_time_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=DEFAULTS["steps"], help="GRPO steps.")
    parser.add_argument("--run-dir", default=None, help="Run folder (default: runs/<date-time>).")
    parser.add_argument("--batch-size", type=int, default=DEFAULTS["batch_size"], help="Problems per step.")
    parser.add_argument("--group-size", type=int, default=DEFAULTS["group_size"], help="Samples per problem.")
    parser.add_argument("--learning-rate", type=float, default=DEFAULTS["learning_rate"])
    parser.add_argument("--temperature", type=float, default=DEFAULTS["temperature"])
    parser.add_argument("--eval-every", type=int, default=DEFAULTS["eval_every"])
    parser.add_argument("--test-size", type=int, default=DEFAULTS["test_size"], help="Held-out problems.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None, help="Hugging Face model (default: the bundled 135M model).")
    parser.add_argument("--curve-to", default=str(HERE / "reward_curve.png"), help="Where to copy the curve.")
    args = parser.parse_args()
    summary = train(
        args.steps,
        args.run_dir,
        batch_size=args.batch_size,
        group_size=args.group_size,
        learning_rate=args.learning_rate,
        temperature=args.temperature,
        eval_every=args.eval_every,
        test_size=args.test_size,
        seed=args.seed,
        curve_to=args.curve_to,
        model=args.model,
    )
    print(
        f"\nheld-out reward (greedy, {args.test_size} problems): base {summary['base_reward']:.3f} "
        f"-> trained {summary['trained_reward']:.3f} after {summary['steps']} steps"
    )
    print("curve: " + ", ".join(f"step {step}: {reward:.3f}" for step, reward in summary["curve"]))
    print(f"wall time: {summary['wall_time_s'] / 60:.1f} min\nreport: {summary.get('report')}")


if __name__ == "__main__":
    main()
