"""From a step's episodes to training samples, pure and torch-free: the error policy, call selection and
credit assignment, group-relative advantages, token-level samples, and the diagnostics of a step with
nothing to learn from. Every function here takes and returns plain data (see docs/training.md)."""

__all__: list[str] = []
