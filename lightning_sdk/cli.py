"""The `lightning-sdk` command: `quickstart`, `train`, `view`, `serve`, `report`, `import`, `sft`, `memory`
and `runner`, in the order a newcomer meets them."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

__all__ = ["main"]

if TYPE_CHECKING:
    Commands = argparse._SubParsersAction[argparse.ArgumentParser]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `lightning-sdk` command."""
    parser = argparse.ArgumentParser(prog="lightning-sdk", description="Train existing AI agents with RL.")
    commands = parser.add_subparsers(dest="command", required=True)

    adders = (  # in the order a newcomer meets them
        _add_quickstart,
        _add_train,
        _add_view,
        _add_serve,
        _add_report,
        _add_import,
        _add_sft,
        _add_memory,
        _add_runner,
    )
    for add in adders:
        add(commands)

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("lightning_sdk").setLevel(logging.INFO)  # our progress, not every HTTP request
    from lightning_sdk.engine.models.resolve import ModelNotFoundError  # light: no torch
    from lightning_sdk.explorer.store_reader import StoreProblem  # light: no FastAPI

    try:
        return int(args.handler(args) or 0)
    except (OSError, ValueError, TypeError, ImportError, ModelNotFoundError, StoreProblem) as error:
        # OSError covers a missing file and a port already in use: a message, not a traceback.
        print(f"lightning-sdk {args.command}: {error}", file=sys.stderr)
        return 2


_VERBOSE_HELP = "Show what the engine and its libraries print on the console (default: run_dir/engine.log)."


def _add_quickstart(commands: Commands) -> None:
    from lightning_sdk.quickstart import QUICKSTART

    quickstart = commands.add_parser(
        "quickstart",
        help="Train a calculator agent (AutoGen + a calculator tool) on the bundled model: 4 to 15 minutes "
        "on two CPU cores.",
    )
    quickstart.add_argument(
        "--steps",
        type=int,
        default=QUICKSTART["steps"],
        help=f"Training steps (default: {QUICKSTART['steps']}).",
    )
    quickstart.add_argument("--run-dir", default=None, help="Run folder (default: runs/<date-time>).")
    quickstart.add_argument("--verbose", action="store_true", help=_VERBOSE_HELP)
    quickstart.set_defaults(handler=_run_quickstart)


def _add_train(commands: Commands) -> None:
    train = commands.add_parser(
        "train", help="Train an agent: lightning-sdk train module:agent --data tasks.jsonl"
    )
    train.add_argument("agent", help="The agent function as module:function (module importable from here).")
    train.add_argument("--data", required=True, help="Training tasks: a .jsonl file, one task per line.")
    train.add_argument("--val-data", default=None, help="Validation tasks (.jsonl).")
    train.add_argument(
        "--reward", default=None, help="Optional reward function module:function(task, output)."
    )
    train.add_argument(
        "--model", default=None, help="Model folder or Hub id (default: bundled SmolLM2-135M)."
    )
    train.add_argument(
        "--engine",
        default="auto",
        choices=["auto", "vllm", "transformers"],
        help="Inference engine (default: vLLM when installed, else transformers).",
    )
    train.add_argument("--config", default=None, help="TrainerConfig fields as a JSON file.")
    train.add_argument("--steps", type=int, default=None, help="Override max_steps.")
    train.add_argument("--run-dir", default=None, help="Run folder.")
    train.add_argument("--resume", action="store_true", help="Continue the run in --run-dir.")
    train.add_argument("--verbose", action="store_true", help=_VERBOSE_HELP)
    train.set_defaults(handler=_run_train)


def _add_memory(commands: Commands) -> None:
    memory = commands.add_parser(
        "memory",
        help="Estimate a training step's memory for a model: lightning-sdk memory --model Qwen/Qwen2.5-3B",
    )
    memory.add_argument("--model", default=None, help="Model folder or Hub id (default: the bundled model).")
    memory.add_argument(
        "--tokens", type=int, nargs="+", default=[1024, 2048, 4096, 8192], help="Tokens per forward pass."
    )
    memory.add_argument("--config", default=None, help="TrainerConfig fields as a JSON file.")
    memory.add_argument("--gpu", action="store_true", help="Estimate for a GPU (bfloat16) even without one.")
    memory.add_argument("--gpu-memory", type=float, default=None, help="GiB available (default: GPU 0's).")
    memory.set_defaults(handler=_run_memory)


def _add_report(commands: Commands) -> None:
    report = commands.add_parser("report", help="Write RUN_DIR/report.html with curves and sample episodes.")
    report.add_argument("run_dir", help="A run folder written by a training run.")
    report.set_defaults(handler=_run_report)


def _add_view(commands: Commands) -> None:
    view = commands.add_parser(
        "view",
        help="Browse a run (or an episode store) in the browser: lightning-sdk view runs/<run>",
    )
    view.add_argument("run_dir", nargs="?", default=None, help="A run folder written by a training run.")
    view.add_argument("--store", default=None, help="An episode store file instead (production traces).")
    view.add_argument("--host", default="127.0.0.1", help="Interface to listen on (default: 127.0.0.1).")
    view.add_argument("--port", type=int, default=8765, help="Port (default 8765; 0: a free one).")
    view.add_argument("--key", default=None, help="Key for other hosts (default: random beyond 127.0.0.1).")
    view.add_argument("--fd", type=int, default=None, help=argparse.SUPPRESS)  # a socket a trainer opened
    view.add_argument("--parent", type=int, default=None, help=argparse.SUPPRESS)  # exit when it has gone
    view.set_defaults(handler=_run_view)


def _add_serve(commands: Commands) -> None:
    from lightning_sdk.serving.cli import add_serve_arguments, run_serve

    serve = commands.add_parser("serve", help="Serve a model (and adapter) with an OpenAI-compatible API.")
    add_serve_arguments(serve)
    serve.set_defaults(handler=run_serve)


def _add_runner(commands: Commands) -> None:
    runner = commands.add_parser(
        "runner",
        help="Run an agent for a trainer elsewhere: lightning-sdk runner module:agent --trainer URL",
    )
    runner.add_argument("agent", help="The agent as module:function or path/to/agent.py:function.")
    runner.add_argument("--trainer", required=True, help="The trainer's server, e.g. http://10.0.0.5:8123.")
    runner.add_argument("--key", default=None, help="The run's key (default: $LIGHTNING_SDK_KEY).")
    key_file_help = "A file holding the run's key (the trainer writes RUN_DIR/runner.key)."
    runner.add_argument("--key-file", default=None, help=key_file_help)
    runner.add_argument("--concurrency", type=int, default=1, help="Episodes run at once (default 1).")
    runner.add_argument("--name", default=None, help="This runner's name in the trainer's records.")
    runner.add_argument("--episode-timeout", type=float, default=300.0, help="Seconds one episode may run.")
    runner.set_defaults(handler=_run_runner)


def _run_quickstart(args: argparse.Namespace) -> int:
    from lightning_sdk.quickstart import run_quickstart

    verbose: dict[str, Any] = {"verbose": True} if args.verbose else {}
    _print_quickstart_summary(run_quickstart(steps=args.steps, run_dir=args.run_dir, **verbose))
    return 0


def _print_quickstart_summary(summary: dict[str, Any]) -> None:
    print(
        f"\nheld-out reward (greedy, word problems solved): base {summary['base_reward']:.3f} "
        f"-> trained {summary['trained_reward']:.3f} after {summary['steps']} steps "
        f"({summary['wall_time_s'] / 60:.1f} min)"
    )
    print(_next_steps(summary["run_dir"], summary["adapter"], summary.get("report")))


def _next_steps(run_dir: str | Path, adapter: str | Path, report: str | Path | None = None) -> str:
    """What to do after a run, in at most four lines: look at it, where its adapter is, how to serve it."""
    offline = f"   (offline: {report})" if report else ""
    return (
        f"look at it: lightning-sdk view {run_dir}{offline}\n"
        f"adapter:    {adapter}\n"
        f"serve it:   lightning-sdk serve --adapter {adapter}"
    )


def _run_train(args: argparse.Namespace) -> int:
    from lightning_sdk.training.config import TrainerConfig
    from lightning_sdk.training.trainer import Trainer

    fields: dict[str, Any] = json.loads(Path(args.config).read_text()) if args.config else {}
    if args.steps is not None:
        fields["max_steps"] = args.steps
    if args.run_dir is not None:
        fields["run_dir"] = args.run_dir
    if args.verbose:
        fields["verbose"] = True
    trainer = Trainer(model=args.model, config=TrainerConfig(**fields), engine=args.engine)
    reward = _load_object(args.reward) if args.reward else None
    val = _read_jsonl(args.val_data) if args.val_data else None
    result = trainer.fit(
        _load_object(args.agent), _read_jsonl(args.data), val, reward=reward, resume=args.resume
    )
    print(f"run: {result.run_dir}")
    if result.initial_eval and result.final_eval:
        print(f"validation reward: {result.initial_eval['reward']:.3f} -> {result.final_eval['reward']:.3f}")
    print(_next_steps(result.run_dir, result.adapter_path))
    return 0


def _run_memory(args: argparse.Namespace) -> int:
    import dataclasses

    from lightning_sdk.engine.models.resolve import resolve_model
    from lightning_sdk.training.config import TrainerConfig
    from lightning_sdk.training.update.memory import GIB, advice, estimate_run_memory, settle_auto

    fields: dict[str, Any] = json.loads(Path(args.config).read_text()) if args.config else {}
    config = TrainerConfig(**fields)
    model_config = json.loads((resolve_model(args.model).path / "config.json").read_text())
    on_gpu, available = _gpu_memory(args)
    print(f"{'tokens':>8} {'checkpointing':>14}  estimate")
    for tokens in args.tokens:
        for checkpointing in (False, True):
            run = dataclasses.replace(
                config,
                micro_batch_tokens=tokens,
                max_sample_tokens=tokens,
                gradient_checkpointing=checkpointing,
            )
            memory = estimate_run_memory(run, model_config, on_gpu)
            fits = "" if available is None else ("  fits" if memory.total <= available else "  does not fit")
            print(f"{tokens:>8} {checkpointing!s:>14}  {memory.describe()}{fits}")
    if available is not None:
        config, chosen, recompute = settle_auto(config, model_config, on_gpu, int(available))
        memory = estimate_run_memory(config, model_config, on_gpu)
        print(f"\nthis configuration: {memory.describe()}")
        if chosen:
            print(f"micro_batch_tokens={config.micro_batch_tokens} ({chosen})")
        if recompute:
            print(recompute)
        print(advice(memory, int(available), config) or f"fits in {available / GIB:.1f} GiB")
    return 0


def _gpu_memory(args: argparse.Namespace) -> tuple[bool, float | None]:
    """Whether to estimate for a GPU, and the bytes available (None: unknown)."""
    if args.gpu_memory is not None:
        return True, args.gpu_memory * 1024**3
    if args.gpu:
        return True, None
    try:
        import torch
    except ImportError:
        return False, None
    if not torch.cuda.is_available():
        return False, None
    return True, torch.cuda.get_device_properties(0).total_memory * 0.9


def _add_sft(commands: Commands) -> None:
    sft = commands.add_parser(
        "sft",
        help="Supervised warm start: train the LoRA adapter on the replies of stored episodes.",
    )
    sft.add_argument("--store", required=True, help="The episode store (SQLite file) to learn from.")
    sft.add_argument("--min-reward", type=float, default=None, help="keep episodes with at least this return")
    sft.add_argument("--epochs", type=int, default=1, help="passes over the samples (default 1)")
    sft.add_argument("--model", default=None, help="Hugging Face model (default: the bundled 135M model)")
    sft.add_argument("--config", default=None, help="A JSON file of TrainerConfig fields.")
    sft.add_argument("--run-dir", default=None, help="Run folder (default: runs/<date-time>).")
    sft.set_defaults(handler=_run_sft)


def _run_sft(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from lightning_sdk.tracing.store import EpisodeStore
    from lightning_sdk.training.config import TrainerConfig
    from lightning_sdk.training.sft import fit_sft

    fields = json.loads(Path(args.config).read_text()) if args.config else {}
    if args.run_dir is not None:
        fields["run_dir"] = args.run_dir
    with EpisodeStore.open_existing(args.store) as store:
        result = fit_sft(
            args.model, TrainerConfig(**fields), store, min_reward=args.min_reward, epochs=args.epochs
        )
    print(f"loss {result.first_loss:.3f} -> {result.last_loss:.3f} over {result.steps} steps")
    print(f"adapter: {result.adapter_path}  (start GRPO from it: TrainerConfig(init_adapter=...))")
    return 0


def _add_import(commands: Commands) -> None:
    imports = commands.add_parser(
        "import",
        help="Import traces recorded elsewhere (OTLP JSON GenAI spans, or our JSONL) into an episode store.",
    )
    imports.add_argument(
        "path",
        nargs="+",
        help="OTLP JSON files (the spans, and the log records that hold the calls' content where the "
        "instrumentation writes it there), or a JSONL file of episodes.",
    )
    imports.add_argument("--store", required=True, help="The episode store (SQLite file) to add them to.")
    imports.add_argument("--format", choices=["auto", "otlp", "jsonl"], default="auto")
    imports.add_argument(
        "--skip-invalid", action="store_true", help="store the spans that read, report the others"
    )
    imports.add_argument(
        "--allow-empty",
        action="store_true",
        help="exit 0 when the file holds no model call (default: an error that says what it holds)",
    )
    imports.set_defaults(handler=_run_import)


def _run_import(args: argparse.Namespace) -> int:
    from lightning_sdk.tracing.formats.trace_files import read_traces, store_traces
    from lightning_sdk.tracing.store import EpisodeStore

    # Read and check first: a refused file leaves no store behind.
    report = read_traces(
        list(args.path), format=args.format, skip_invalid=args.skip_invalid, allow_empty=args.allow_empty
    )
    with EpisodeStore(args.store) as store:
        store_traces(report, store)
    print(f"imported {len(report.episodes)} episode(s) with {report.calls} call(s) into {args.store}")
    for problem in report.skipped:
        print(f"skipped: {problem}", file=sys.stderr)
    return 0


def _run_report(args: argparse.Namespace) -> int:
    from lightning_sdk.explorer import write_snapshot

    print(write_snapshot(args.run_dir))
    return 0


def _run_view(args: argparse.Namespace) -> int:
    from lightning_sdk.explorer import serve_explorer

    if (args.run_dir is None) == (args.store is None):
        raise ValueError("name a run folder (lightning-sdk view runs/<run>) or --store FILE, one of the two.")
    server = serve_explorer(
        args.run_dir, store=args.store, host=args.host, port=args.port, key=args.key, fd=args.fd
    )
    print(f"Run explorer: {server.url}  (Ctrl+C stops it)", flush=True)
    server.wait(parent=args.parent)
    return 0


def _run_runner(args: argparse.Namespace) -> int:
    import os

    from lightning_sdk.rollouts.runner import load_agent, run_runner
    from lightning_sdk.rollouts.runners import KEY_VARIABLE

    key = args.key or os.environ.get(KEY_VARIABLE)
    if args.key_file is not None:
        key = Path(args.key_file).read_text(encoding="utf-8").strip()
    if not key:
        raise ValueError(
            f"the run's key is needed: --key-file (the trainer's start line names it), --key or "
            f"${KEY_VARIABLE}."
        )
    try:
        run_runner(
            load_agent(args.agent),
            args.trainer,
            key,
            concurrency=args.concurrency,
            name=args.name,
            episode_timeout_s=args.episode_timeout,
        )
    except KeyboardInterrupt:
        print("runner stopped", file=sys.stderr)
    return 0


def _load_object(spec: str) -> Any:
    from lightning_sdk.rollouts.runner.agents import load_agent

    return load_agent(spec)


def _read_jsonl(path: str) -> list[Any]:
    # Lines end at "\n" only: str.splitlines() would also split a task whose text holds U+2028 or U+0085,
    # which JSON writers leave as they are.
    lines = Path(path).read_text(encoding="utf-8").split("\n")
    return [json.loads(line) for line in lines if line.strip()]


if __name__ == "__main__":
    raise SystemExit(main())
