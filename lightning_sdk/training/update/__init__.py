"""The update, in torch: log-probabilities and micro-batches, the GRPO loss, one optimizer step, the LoRA
adapter (build, save, load), checkpoints, the merged export, and torchrun's process group."""

__all__: list[str] = []
