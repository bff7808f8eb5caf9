"""The trainer: credit assignment, GRPO advantages, samples, loss, LoRA, checkpoints and metrics.

Each stage is a small module over plain data (see docs/training.md). Importing this package imports
nothing heavy; `torch`, `transformers` and `peft` load with the modules that need them.
"""

__all__: list[str] = []
