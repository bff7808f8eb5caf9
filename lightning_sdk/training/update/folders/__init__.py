"""The run's folders on disk: adapter folders written and checked whole, checkpoints written atomically,
and the merged export of a trained adapter."""

__all__: list[str] = []
