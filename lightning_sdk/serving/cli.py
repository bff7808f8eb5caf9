"""The `lightning-sdk serve` command: arguments and entry point (wired up in `lightning_sdk/cli.py`)."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

__all__ = ["add_serve_arguments", "run_serve"]


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the `serve` command's options to an argparse (sub)parser."""
    parser.add_argument(
        "--model",
        default=None,
        help="Hugging Face model folder or Hub id (default: the bundled SmolLM2-135M-Instruct).",
    )
    parser.add_argument(
        "--adapter",
        default=None,
        help="peft LoRA adapter folder to serve on top of the model, or a run's folder of role adapters "
        "(each answers requests with model=<role>).",
    )
    parser.add_argument(
        "--engine",
        choices=["auto", "vllm", "transformers"],
        default="auto",
        help="Inference engine (default: vLLM when installed).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="Interface to listen on (default: 127.0.0.1).")
    parser.add_argument("--port", type=int, default=8000, help="Port (default: 8000; 0 picks a free one).")
    parser.add_argument("--api-key", default=None, help="Bearer key clients must send (default: random).")
    parser.add_argument("--max-model-len", type=int, default=None, help="Context window in tokens.")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="Completion length when a request sets no max_tokens (default: rest of the context).",
    )
    parser.add_argument(
        "--tool-parser",
        default="hermes",
        metavar="NAME",
        help="Tool-call format the model writes: hermes (default) or a vLLM --tool-call-parser name such as "
        "llama3_json, mistral or qwen3_xml (for models whose chat template renders tools).",
    )
    parser.add_argument(
        "--store",
        default=None,
        metavar="PATH",
        help="the episode store (SQLite file) your agents record into: the server then takes rewards that "
        "arrive later at POST /v1/episodes/<id>/feedback",
    )
    parser.add_argument(
        "--reward-range",
        nargs=2,
        type=float,
        default=None,
        metavar=("LOW", "HIGH"),
        help="with --store: refuse feedback rewards outside [LOW, HIGH]",
    )
    parser.add_argument(
        "--upstream",
        default=None,
        metavar="URL",
        help="OpenAI-compatible API (base URL with /v1) that receives the inference requests this server "
        "does not serve, such as /v1/embeddings; its key is read from OPENAI_API_KEY (default: none, such "
        "requests get a 404).",
    )
    parser.add_argument(
        "--passthrough-route",
        action="append",
        default=None,
        metavar="'METHOD /v1/PATH'",
        help="with --upstream: pass this route through too, besides the inference routes passed by default "
        "(embeddings, moderations, images, audio, GET /v1/models/*); '*' matches one path segment. "
        "Repeat for more.",
    )


def run_serve(args: argparse.Namespace) -> int:
    """Start the server from parsed arguments, print how to reach it, and serve until Ctrl+C."""
    from lightning_sdk.serving.endpoint import write_secret_file
    from lightning_sdk.serving.passthrough.routes import PASSTHROUGH_ROUTES
    from lightning_sdk.serving.server import serve

    extra = tuple(args.passthrough_route or ())
    options = {} if args.max_model_len is None else {"max_model_len": args.max_model_len}
    handle = serve(
        args.model,
        args.adapter,
        engine=args.engine,
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        default_max_tokens=args.max_tokens,
        upstream=args.upstream,
        passthrough_routes=(*PASSTHROUGH_ROUTES, *extra) if extra else None,
        tool_parser=args.tool_parser,
        store=args.store,
        reward_range=tuple(args.reward_range) if args.reward_range else None,
        **options,
    )
    endpoint = handle.endpoint
    key_file = None
    if args.api_key is None:  # a random key: kept in a file of the owner's, never printed (issue 50)
        port = endpoint.base_url.rsplit(":", 1)[1].split("/")[0]
        key_file = write_secret_file(
            Path(tempfile.gettempdir()) / f"lightning-sdk-serve-{port}.key", endpoint.api_key
        )
    print(f"Serving {endpoint.model} at {endpoint.base_url}  (Ctrl+C to stop)")
    print(f"  export OPENAI_BASE_URL={endpoint.base_url}")
    if key_file is None:
        print("  export OPENAI_API_KEY=<the key you passed with --api-key>")
    else:
        print(f'  export OPENAI_API_KEY="$(cat {key_file})"  # mode 0600, removed when the server stops')
    roles = getattr(handle.engine, "roles", ())
    if roles:
        print(f'Role adapters: {", ".join(roles)} (ask for one with model="<role>")')
    if args.store:
        print(f"Feedback: POST {endpoint.base_url}/episodes/<episode id>/feedback into {args.store}")
    if args.upstream:
        print(f"Inference requests for other routes (embeddings, ...) pass through to {args.upstream}")
    try:
        handle.wait()
    finally:
        if key_file is not None:
            key_file.unlink(missing_ok=True)
    return 0
