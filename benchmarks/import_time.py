"""How long `import lightning_sdk` takes, in fresh processes, and what it loads.

    python benchmarks/import_time.py                # 20 fresh processes, median and spread
    python benchmarks/import_time.py --runs 50

Each run is `python -X importtime -c "import lightning_sdk"` in a new process; the figure is the package's
cumulative import time as `-X importtime` reports it (the interpreter's own start-up is not counted). The
five slowest modules of the median run are listed, and the run fails if the import loaded torch, vLLM,
transformers, peft, openai or anthropic. Writes benchmarks/results/import_time.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HEAVY = ("torch", "vllm", "transformers", "peft", "openai", "anthropic")
RESULTS = Path(__file__).parent / "results" / "import_time.md"


def one_import() -> tuple[float, list[tuple[float, str]]]:
    """The package's cumulative import time in ms, and every module's (cumulative ms, name)."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import lightning_sdk"],
        capture_output=True,
        text=True,
        check=True,
    )
    modules = []
    for line in result.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line.removeprefix("import time:").split("|")
        modules.append((int(cumulative) / 1000, name.strip()))
    total = next(ms for ms, name in modules if name == "lightning_sdk")
    return total, modules


def heavy_modules() -> list[str]:
    script = (
        f"import sys, lightning_sdk; print(' '.join(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))"
    )
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout.split()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    one_import()  # compiles the bytecode caches, as an installed package has them
    runs = [one_import() for _ in range(args.runs)]
    totals = sorted(total for total, _ in runs)
    median_run = min(runs, key=lambda run: abs(run[0] - statistics.median(totals)))
    slowest = sorted(
        ((ms, name) for ms, name in median_run[1] if name.startswith("lightning_sdk.")), reverse=True
    )[:5]
    heavy = heavy_modules()
    load = os.getloadavg()[0]
    lines = [
        "# `import lightning_sdk`",
        "",
        f"Written by `python benchmarks/import_time.py --runs {args.runs}` on "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} CPU cores "
        f"({platform.machine()}, {platform.processor() or 'unknown processor'}), Python "
        f"{platform.python_version()}, load average {load:.1f} when it finished.",
        "",
        "| runs | median ms | fastest | slowest | heavy modules loaded |",
        "| ---: | ---: | ---: | ---: | --- |",
        f"| {args.runs} | {statistics.median(totals):.1f} | {totals[0]:.1f} | {totals[-1]:.1f} | "
        f"{', '.join(heavy) or 'none'} |",
        "",
        "Slowest of the package's own modules in the median run (cumulative ms):",
        "",
        *(f"- `{name}`: {ms:.1f}" for ms, name in slowest),
        "",
    ]
    RESULTS.write_text("\n".join(lines))
    print("\n".join(lines))
    if heavy:
        sys.exit(f"import lightning_sdk loaded {', '.join(heavy)}")


if __name__ == "__main__":
    main()
