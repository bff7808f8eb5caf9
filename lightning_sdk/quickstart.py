"""The quickstart: train the calculator agent (an AutoGen assistant with a calculator tool) briefly, on a CPU.

`lightning-sdk quickstart` (and `make demo`) runs `examples/calc_autogen` with a short configuration
(3 to 10 minutes of training on two idle CPU cores, depending on the CPU; 4 to 15 minutes with engine
start and the evaluations), prints the held-out reward of the base model and of the trained one, and
where to look next. The agent is ordinary AutoGen code with the two decorators
(see `examples/calc_autogen/agent.py`, installed as `lightning_sdk.examples.calc_autogen.agent`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from lightning_sdk.engine.types import Engine

__all__ = ["QUICKSTART", "run_quickstart"]

QUICKSTART: dict[str, Any] = {
    "steps": 8,
    "test_size": 48,
    "eval_every": 4,
    "dynamic_sampling_rounds": 2,
    "learning_rate": 4e-4,
    "max_time_s": 900.0,
    "micro_batch_tokens": 4096,
    "max_sample_tokens": 1024,
}
"""The short configuration: fewer steps and held-out problems than the example's own defaults, an
evaluation every 4 steps (so the curve has points between the first and the last), and dynamic
sampling: the bundled model solves few problems at first, so most groups of attempts are all wrong
and carry no learning signal; up to two more rounds of fresh problems per step replace them. Without
it, one seed in three learned; with it, every seed measured did (docs/benchmarks.md). Twice the
example's learning rate did better in each of the seeds swept beside it (temperature 1.0 and 16 samples
of 2 problems did worse). `max_time_s`
ends training earlier on a machine much busier than two idle cores. `micro_batch_tokens=4096` and
`max_sample_tokens=1024` fit this agent's calls (a few hundred tokens each, at most 48 of them written by
the model): the start-up memory line is a bound at those settings, and the defaults (16384, 8192) made it
say 20 GiB for a demo that peaks near 8. Splitting a step into micro-batches does not change its
result. Timings and results are measured in `benchmarks/` (docs/benchmarks.md), not here, where they
would go stale."""

_INSTALL_HINT = (
    "The quickstart trains an AutoGen agent, but AutoGen is not installed ({error}). "
    "Install it with: pip install -e '.[autogen]' (or pip install 'lightning-sdk[autogen]')."
)


def run_quickstart(
    steps: int = QUICKSTART["steps"],
    run_dir: str | Path | None = None,
    *,
    report: bool = True,
    engine: Engine | Literal["auto"] = "auto",
    **options: Any,
) -> dict[str, Any]:
    """Train the calculator agent for `steps` steps; return base and trained held-out reward and paths.

    Args:
        steps: GRPO steps.
        run_dir: the run folder (default: `runs/<date-time>`).
        report: write `report.html` with the curves and sample episodes into the run folder.
        engine: `"auto"`, or an engine you built (it is used as is).
        options: other arguments of `lightning_sdk.examples.calc_autogen.train.train` (e.g. `test_size`).

    Raises:
        ImportError: when AutoGen is not installed; the message names the install command.
    """
    try:
        import autogen_agentchat  # noqa: F401 - checked here so the error names the extra to install
        import autogen_ext.models.openai  # noqa: F401
    except ImportError as error:
        raise ImportError(_INSTALL_HINT.format(error=error)) from error
    from lightning_sdk.examples.calc_autogen.train import train

    settings = {**QUICKSTART, **options, "steps": steps}
    summary: dict[str, Any] = train(run_dir=run_dir, report=report, engine=engine, **settings)
    return summary
