"""Where a bfloat16 engine's gap to the float32 trainer comes from: rounding the base weights, or rounding the
merged adapter update (issue 59, "find out the rest").

Reads a finished `benchmarks/policy_gap.py` run whose engine served in bfloat16 (its adapter and the
sampled calls of its last steps), and scores those calls' sampled tokens in float32 arithmetic under five
sets of weights, so that kernels play no part and only the weights differ:

- `trainer`: the base weights W plus the adapter's update D, in float32: the policy that learns;
- `base`: W alone (how much the adapter moved each token: the update's own size);
- `merged, rounded`: bfloat16(W + D), what the engine's merged push serves;
- `base rounded, update exact`: bfloat16(W) + D, which a hot-loaded LoRA adapter (`weight_sync="lora"`)
  serves: the rounding of W alone;
- `base rounded`: bfloat16(W), the reference the kept share of the update is measured from.

and reports each one's mean |log p - log p_trainer| per token, the share of the update's effect that
survives (the least-squares slope of `log p_variant - log p_base(rounded)` on `log p_trainer - log p_base`),
beside the gap the run measured step by step with the engine's own kernels (`mismatch_logratio_abs`). The
tokens are the run's own samples; the weights are its final adapter's (the tokens' engine log-probabilities
came from the step before, so they are not compared here).

    python benchmarks/policy_gap_parts.py                         # the bfloat16, seed 0 run
    python benchmarks/policy_gap_parts.py --run runs/policy_gap/bfloat16-seed1 --calls 96
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "policy_gap_parts.md"


def sampled_calls(run_dir: Path, count: int) -> list[Any]:
    """The newest `count` calls of the run's training episodes that carry token ids."""
    from lightning_sdk.tracing.store import EpisodeStore

    with EpisodeStore(run_dir / "episodes.sqlite") as store:
        calls = [call for episode in store.episodes() for call in episode.trainable_calls() if call.logprobs]
    return calls[-count:]


def weights_of(model_path: Path, adapter: Path) -> dict[str, dict[str, Any]]:
    """The four state dicts (float32 tensors) named in the module docstring."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
    base_state = {name: tensor.clone() for name, tensor in base.state_dict().items()}
    merged = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload().state_dict()
    rounded = {name: tensor.to(torch.bfloat16).float() for name, tensor in base_state.items()}
    return {
        "trainer": merged,
        "base": base_state,
        "merged, rounded": {name: tensor.to(torch.bfloat16).float() for name, tensor in merged.items()},
        "base rounded, update exact": {
            name: rounded[name] + (merged[name] - base_state[name]) for name in base_state
        },
        "base rounded": rounded,
    }


def logprobs_under(model_path: Path, states: dict[str, dict[str, Any]], calls: list[Any], temperature: float):
    import torch
    from transformers import AutoModelForCausalLM

    from lightning_sdk.training.algorithm.samples import Sample
    from lightning_sdk.training.update.forward.batching import collate
    from lightning_sdk.training.update.forward.logprobs import token_logprobs

    samples = [
        Sample(
            call.prompt_token_ids,
            call.completion_token_ids,
            [1] * len(call.completion_token_ids),
            list(call.logprobs),
            [0.0] * len(call.completion_token_ids),
            temperature=temperature,
        )
        for call in calls
    ]
    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32).eval()
    results = {}
    for name, state in states.items():
        model.load_state_dict(state)
        values = []
        for start in range(0, len(samples), 16):
            batch = collate(samples[start : start + 16])
            with torch.no_grad():
                logprobs, _ = token_logprobs(model, batch, with_entropy=False, layout="padded")
            values.append(logprobs[batch.loss_mask.bool()])
        results[name] = torch.cat(values).double()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run", type=Path, default=ROOT / "runs" / "policy_gap" / "bfloat16-seed0")
    parser.add_argument("--calls", type=int, default=64)
    args = parser.parse_args()
    run_info = json.loads((args.run / "run.json").read_text())
    start, config = run_info["starts"][-1], run_info["config"]
    model_path = Path(start["model_path"])
    calls = sampled_calls(args.run, args.calls)
    scored = logprobs_under(
        model_path, weights_of(model_path, args.run / "adapter"), calls, config["temperature"]
    )
    trainer, base, base_rounded = scored["trainer"], scored["base"], scored["base rounded"]
    update = trainer - base
    rows = []
    for name in ("base", "merged, rounded", "base rounded, update exact"):
        gap = float((scored[name] - trainer).abs().mean())
        kept = float(((scored[name] - base_rounded) * update).sum() / (update * update).sum())
        rows.append(f"| {name} | {gap:.4f} | {'' if name == 'base' else f'{kept:.0%}'} |")
    measured = [
        json.loads(line).get("mismatch_logratio_abs")
        for line in (args.run / "metrics.jsonl").read_text().splitlines()
        if line and "reward_mean" in line
    ]
    text = "\n".join(
        [
            "# Where a bfloat16 engine's gap comes from",
            "",
            f"Written by `python benchmarks/policy_gap_parts.py --run {args.run.relative_to(ROOT)}`",
            f"on the run's newest {len(calls)} sampled calls ({len(trainer)} tokens), scored in float32",
            "arithmetic under each set of weights (see the script's docstring). Gap = mean",
            "|log p - log p_trainer| per token, in nats;",
            "update kept = the share of the adapter's effect on the tokens' log-probabilities that survives",
            f"(the adapter moved them by {float(update.abs().mean()):.4f} nats per token on average).",
            "",
            "| weights | gap to the trainer | update kept |",
            "|---|---|---|",
            *rows,
            "",
            "The run's own per-step `mismatch_logratio_abs` (engine kernels, bfloat16): "
            + ", ".join(f"{value:.4f}" for value in measured if isinstance(value, float))
            + f" (median {statistics.median(v for v in measured if isinstance(v, float)):.4f}).",
            "",
        ]
    )
    OUT.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
