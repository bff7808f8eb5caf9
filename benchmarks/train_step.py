"""How long does the train phase of one step take on the bundled model, with and without prompt sharing?

The batch has the shape of the trainer issue's A + B task: 4 prompts x 8 completions of 16 tokens, as a
GRPO step sees them. Two ways to compute the completion log-probabilities (forward + backward through
the LoRA model):

- `full sequences`: every sample runs its whole prompt + completion;
- `shared prompts`: each distinct prompt runs once and its key/value cache serves its 8 completions
  (what `token_logprobs` does by default when prompts repeat).

Both are timed in rounds, interleaved, and the table shows medians of wall-clock time and of process
CPU time (the CPU time is less sensitive to other programs on a shared machine). Usage:

    python benchmarks/train_step.py [--rounds 3] [--threads N]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

LAYOUTS = {
    "padded": ("padded", False),
    "cached prompts": ("cached", False),
    "packed": ("packed", False),
    "packed + entropy": ("packed", True),
}


def build_samples(tokenizer, prompts: int, group: int, completion_tokens: int, prompt_words: int = 0) -> list:
    from lightning_sdk.training.algorithm.samples import Sample

    rng = random.Random(0)
    context = "note " * prompt_words
    samples = []
    for _ in range(prompts):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        prompt = tokenizer.apply_chat_template(
            [
                {
                    "role": "user",
                    "content": context + f"What is {a} + {b}? Reply with only the number.",
                }
            ],
            add_generation_prompt=True,
            return_dict=False,
        )
        for _ in range(group):
            completion = [rng.randrange(100, 40000) for _ in range(completion_tokens)]
            advantage = rng.choice([1.0, -1.0])
            samples.append(
                Sample(
                    list(prompt),
                    completion,
                    [1] * completion_tokens,
                    [None] * completion_tokens,
                    [advantage] * completion_tokens,
                )
            )
    return samples


def timed_pass(model, batch, layout: str, with_entropy: bool = False) -> tuple[float, float]:
    from lightning_sdk.training.update.forward.logprobs import token_logprobs

    wall, cpu = time.perf_counter(), time.process_time()
    logprobs, _ = token_logprobs(model, batch, with_entropy=with_entropy, layout=layout)
    (-(logprobs * batch.advantages * batch.loss_mask).sum()).backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--completion-tokens", type=int, default=16)
    parser.add_argument("--prompt-words", type=int, default=0, help="extra words of context in each prompt")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import AutoTokenizer

    from lightning_sdk.engine.models.resolve import resolve_model
    from lightning_sdk.training.config import TrainerConfig
    from lightning_sdk.training.update.forward.batching import collate
    from lightning_sdk.training.update.lora import build_lora_model, load_base_model

    path = resolve_model(None).path
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model = build_lora_model(load_base_model(path), TrainerConfig())
    samples = build_samples(tokenizer, args.prompts, args.group, args.completion_tokens, args.prompt_words)
    batch = collate(samples, tokenizer.pad_token_id)
    timed_pass(model, collate(samples[:2], tokenizer.pad_token_id), "packed")  # warm-up

    results: dict[str, list[tuple[float, float]]] = {name: [] for name in LAYOUTS}
    for _ in range(args.rounds):
        for name, (layout, entropy) in LAYOUTS.items():
            results[name].append(timed_pass(model, batch, layout, entropy))

    print(
        f"{len(samples)} samples, prompt {len(samples[0].prompt_ids)} + completion "
        f"{args.completion_tokens} tokens, {args.threads} thread(s), {args.rounds} rounds"
    )
    print(f"| {'forward + backward':<20} | {'wall s (median)':>15} | {'CPU s (median)':>14} |")
    print(f"|{'-' * 22}|{'-' * 17}|{'-' * 16}|")
    for name, values in results.items():
        wall = statistics.median(value[0] for value in values)
        cpu = statistics.median(value[1] for value in values)
        print(f"| {name:<20} | {wall:>15.2f} | {cpu:>14.2f} |")


if __name__ == "__main__":
    main()
