"""Two GRPO steps of `Trainer.fit` with `engine="transformers"`, for a GPU machine without vLLM or a Hub.

    python scripts/gpu_fit_check.py build gpu_check_model   # here: a small random-weight model folder
    python scripts/gpu_fit_check.py fit gpu_check_model      # there: the fit, on CUDA when there is one

`build` writes a Llama-shaped model with random weights (4 layers, hidden size 256, the bundled model's
tokenizer and 49k vocabulary; 30 MB in bfloat16) so that only this folder, not the bundled 94 MB GGUF, has to
be copied to the GPU machine. `fit` trains it for two steps on a toy task through the whole loop (engine,
OpenAI-compatible endpoint, agent over HTTP, packed training pass, adapter push) and prints the steps'
statistics; the replies of a random model are noise, so this checks that the loop runs, not that it learns.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def build(folder: Path) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from lightning_sdk.engine.models.resolve import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model(None).path))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    size = sum(path.stat().st_size for path in folder.iterdir()) / 2**20
    print(f"wrote {folder} ({size:.0f} MiB)")


def fit(folder: Path, run_dir: Path) -> None:
    import openai
    import torch

    import lightning_sdk as ls

    @ls.reward
    def length_reward(task: dict[str, Any], answer: str) -> float:
        # Any reward that differs between a group's samples trains; a random model's replies differ.
        return len(answer) % 11 / 10

    @ls.trace_agent(name="writer")
    def writer(task: dict[str, Any]) -> str:
        reply = openai.OpenAI().chat.completions.create(
            model="default", messages=[{"role": "user", "content": task["question"]}], max_tokens=32
        )
        answer = reply.choices[0].message.content or ""
        length_reward(task, answer)
        return answer

    config = ls.TrainerConfig(
        group_size=4,
        batch_size=2,
        max_steps=2,
        max_tokens=32,
        temperature=1.0,
        eval_every=0,
        run_dir=str(run_dir),
        progress_bar=False,
    )
    tasks = [{"question": f"Write a few words about the number {index}."} for index in range(8)]
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    print(f"fit: 2 steps on {device}, engine transformers, model {folder}")
    start = time.perf_counter()
    result = ls.Trainer(str(folder), config, engine="transformers").fit(writer, tasks)
    print(f"fit: done in {time.perf_counter() - start:.0f} s, adapter {result.adapter_path}")
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    for step in steps:
        keys = ("step", "reward_mean", "groups_with_signal", "trained_tokens", "loss", "time_train_s")
        print("fit: " + ", ".join(f"{key}={step.get(key)}" for key in keys))
    if not any(step.get("trained_tokens") for step in steps):
        raise SystemExit("fit: no step trained a token (no group had a reward spread?)")


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] not in ("build", "fit"):
        raise SystemExit(__doc__)
    folder = Path(sys.argv[2])
    if sys.argv[1] == "build":
        build(folder)
        return
    if not (folder / "config.json").is_file():
        raise SystemExit(f"{folder} is not a model folder: run `python {sys.argv[0]} build {folder}` first.")
    run_dir = Path(sys.argv[3]) if len(sys.argv) > 3 else Path(tempfile.mkdtemp(prefix="gpu-fit-check-"))
    fit(folder, run_dir)


if __name__ == "__main__":
    main()
