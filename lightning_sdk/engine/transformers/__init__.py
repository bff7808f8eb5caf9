"""The transformers backend: `TransformersEngine`, the fallback where vLLM is not installed, and the
batched sampling loop it runs on its own thread."""
