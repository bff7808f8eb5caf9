"""The training forward pass: samples to batches and micro-batches, the packed row and its attention mask,
per-token log-probabilities computed in chunks, and the optional fused kernels for the policy on a GPU."""

__all__: list[str] = []
