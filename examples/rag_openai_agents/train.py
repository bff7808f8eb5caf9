"""Train the retrieval agent on the bundled model: `python examples/rag_openai_agents/train.py`.

Prints the held-out reward (token F1, greedy) of the base model and of the trained one, writes the
run folder with its HTML report, and copies the validation curve next to this file.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["make_config", "train"]

EXAMPLE_DIR = Path(__file__).resolve().parent


def make_config(steps: int, run_dir: str | None, **overrides: Any) -> Any:
    """The measured configuration (see the README); `overrides` replace any field."""
    from lightning_sdk.training.config import TrainerConfig

    fields: dict[str, Any] = {
        "group_size": 6,
        "batch_size": 4,
        "max_steps": steps,
        "learning_rate": 3e-4,
        "temperature": 0.8,
        "max_tokens": 32,
        "eval_every": 5,
        "save_every": 0,
        "run_dir": run_dir,
        "seed": 0,
        # Prompts are ~500 tokens (tool description and worked examples): small micro-batches keep the
        # training forward pass (logits over a 49k vocabulary) within a few GiB.
        "micro_batch_size": 2,
        # A safety net on a busy machine: the run stops after the step that passes 20 minutes.
        "max_time_s": 1200.0,
    }
    return TrainerConfig(**{**fields, **overrides})


def train(
    steps: int = 20,
    run_dir: str | None = None,
    engine: Any = "auto",
    test_size: int | None = 64,
    curve_to: Path | None = EXAMPLE_DIR / "reward_curve.png",
    *,
    model: str | None = None,
    data_seed: int = 0,
    **overrides: Any,
) -> dict[str, Any]:
    """Train and evaluate; return base and trained held-out reward and where the run went.

    `engine` may be an engine you already started (the tests share one); `model` is `None` for the bundled
    SmolLM2-135M-Instruct, or a Hugging Face folder or Hub id; `data_seed` seeds the encyclopedia and the
    questions; `overrides` go to the config.
    """
    from agents import set_tracing_disabled

    from lightning_sdk.examples.rag_openai_agents.agent import rag_agent
    from lightning_sdk.examples.rag_openai_agents.data import build_tasks
    from lightning_sdk.examples.results import summarize_fit
    from lightning_sdk.training.trainer import Trainer

    # No traces leave this machine; agent names are kept with the SDK's tracing off.
    set_tracing_disabled(True)
    config = make_config(steps, run_dir, **overrides)
    with tempfile.TemporaryDirectory(prefix="rag-corpus-") as corpus_dir:
        train_tasks, test_tasks = build_tasks(corpus_dir, seed=data_seed, test_size=test_size)
        result = Trainer(model, config=config, engine=engine).fit(
            rag_agent, train_tasks, val_dataset=test_tasks
        )
    return summarize_fit(result, curve_to=curve_to)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps (default: 20)")
    parser.add_argument("--run-dir", default=None, help="run folder (default: runs/<date-time>)")
    parser.add_argument("--batch-size", type=int, default=4, help="questions per step (default: 4)")
    parser.add_argument("--group-size", type=int, default=6, help="answers per question (default: 6)")
    parser.add_argument("--test-size", type=int, default=64, help="held-out questions (default: 64)")
    parser.add_argument(
        "--data-seed", type=int, default=0, help="seed of the corpus and questions (default: 0)"
    )
    parser.add_argument("--model", default=None, help="Hugging Face model (default: the bundled 135M model)")
    args = parser.parse_args()
    summary = train(
        steps=args.steps,
        run_dir=args.run_dir,
        test_size=args.test_size,
        model=args.model,
        data_seed=args.data_seed,
        batch_size=args.batch_size,
        group_size=args.group_size,
    )
    print(
        f"held-out token F1 (greedy): base {summary['base_reward']:.3f} "
        f"-> trained {summary['trained_reward']:.3f}"
    )
    print(f"run folder: {summary['run_dir']}\nreport: {summary['report']}")


if __name__ == "__main__":
    main()
