"""`TransformersEngine`: the fallback engine on plain transformers, where vLLM does not install."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_sdk.engine.base import EngineBase
from lightning_sdk.engine.lora.merge import load_safetensors_folder, merge_lora_adapter
from lightning_sdk.engine.models.resolve import ResolvedModel, resolve_model
from lightning_sdk.engine.placement import auto_dtype, plan_placement
from lightning_sdk.engine.streams import RequestStream
from lightning_sdk.engine.types import (
    EngineError,
    SamplingParams,
    WeightSync,
    WeightVersion,
    check_prompt_fits,
)

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["TransformersEngine"]

_STOP = object()


class TransformersEngine(EngineBase):
    """transformers generation behind the same interface as `VLLMEngine`.

    Requests are batched statically: whatever has arrived when the worker thread is free runs as one
    padded batch (up to `max_batch_size` completions), and requests arriving meanwhile wait for the next
    batch. Outputs are the same as vLLM's: exact token ids, sampling logprobs, text and finish reasons.
    LoRA adapters are merged into the weights (`weight_sync="merge"`), so generation keeps base speed.

    Args:
        model: `None` (bundled SmolLM2-135M-Instruct), a local Hugging Face folder or a Hub id.
        dtype: "auto" (float32 on CPU, bfloat16 on GPU), or a torch dtype name.
        device: "cpu", "cuda:0", ...; default: this process's device (`lightning_sdk.engine.placement`: the
            GPU of its local rank when there are GPUs). A bare "cuda" means the current GPU.
        max_model_len: Context window; default: the model's `max_position_embeddings`, at most 4096.
        max_batch_size: Most completions decoded together.
        max_n: Largest `n` a request may ask for.
        seed: Seeds requests that bring no seed of their own.
    """

    weight_sync: WeightSync = "merge"

    def __init__(
        self,
        model: str | Path | ResolvedModel | None = None,
        *,
        dtype: str = "auto",
        device: str | None = None,
        max_model_len: int | None = None,
        max_batch_size: int = 32,
        max_n: int = 16,
        seed: int = 0,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model: ResolvedModel = model if isinstance(model, ResolvedModel) else resolve_model(model)
        self.device = _explicit_device(device or plan_placement().device)
        torch_dtype = _torch_dtype(dtype, self.device)
        self.dtype: str = str(torch_dtype).removeprefix("torch.")
        """The dtype the model computes in (e.g. `"float32"`), with `"auto"` resolved."""
        self._tokenizer = AutoTokenizer.from_pretrained(self.model.path)
        loaded: Any = AutoModelForCausalLM.from_pretrained(self.model.path, dtype=torch_dtype)
        self._model = loaded.to(self.device)
        self._model.eval()
        config = self._model.config
        self.max_model_len: int = max_model_len or min(getattr(config, "max_position_embeddings", 4096), 4096)
        self.max_batch_size = max_batch_size
        self.max_n = max_n
        self.structured_outputs = False  # no grammar-constrained decoding here; vLLM has it
        self.max_adapters = 0  # one set of weights: adapters are merged in, so roles cannot differ
        self._eos_ids = _eos_ids(self._model, self._tokenizer)
        self._pad_id = self._tokenizer.pad_token_id if self._tokenizer.pad_token_id is not None else 0
        self._seeds = torch.Generator().manual_seed(seed)
        self._version: WeightVersion = None
        self._base_weights: dict[str, torch.Tensor] | None = None
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="lightning-sdk-transformers", daemon=True)
        self._thread.start()

    def _submit(
        self, prompt_token_ids: Sequence[int], params: SamplingParams, *, asynchronous: bool, deltas: bool
    ) -> tuple[RequestStream, WeightVersion]:
        # Every step's tokens reach the stream either way (`deltas` only spares vLLM's output processing).
        check_prompt_fits(len(prompt_token_ids), params.max_tokens, self.max_model_len)
        if params.n > self.max_n:
            raise ValueError(f"n={params.n} is above this engine's max_n={self.max_n}.")
        if params.structured:
            raise ValueError(
                "Structured outputs (a JSON schema or JSON object response format, or a grammar) "
                "need the vLLM "
                "engine, which constrains decoding; the transformers engine cannot. Serve with engine='vllm'."
            )
        stream = RequestStream(asynchronous, copies=params.n // params.distinct_samples)
        self._post(("generate", list(prompt_token_ids), params, stream))
        return stream, self._version

    # -- new weights ---------------------------------------------------------------------------------------
    def load_adapter(self, path: str | Path | None, version: WeightVersion, role: str | None = None) -> None:
        """Serve the peft LoRA adapter in `path` (merged into the weights), or the base weights for `None`.
        Role adapters need the vLLM engine (`max_adapters` is 0 here)."""
        if role is not None:
            raise ValueError(
                f"The transformers engine serves one set of weights and cannot serve role {role!r} its own "
                "adapter; use engine='vllm' (TrainerConfig(roles=...) needs it)."
            )
        base = self._base()
        served = self._model.dtype  # merged in the model's dtype, not the (narrower) stored one
        self.update_weights(base if path is None else merge_lora_adapter(base, path, served), version)

    def update_weights(
        self, weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], version: WeightVersion
    ) -> None:
        """Copy full weights (checkpoint names) into the model, between two batches."""
        state = dict(weights.items() if isinstance(weights, Mapping) else weights)
        done: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()
        self._post(("weights", state, done))
        error = done.get()
        if error is not None:
            raise error
        self._version = version

    def _base(self) -> dict[str, torch.Tensor]:
        if self._base_weights is None:
            self._base_weights = load_safetensors_folder(self.model.path)
        return self._base_weights

    # -- lifecycle -----------------------------------------------------------------------------------------
    def sleep(self) -> None:
        """No-op: this engine holds no cache between batches."""

    def wake(self) -> None:
        """No-op: see `sleep`."""

    def shutdown(self) -> None:
        """Stop the worker thread; pending requests fail."""
        if self._thread.is_alive():
            self._inbox.put(_STOP)
            self._thread.join(timeout=60)
        self._base_weights = None

    # -- worker thread -------------------------------------------------------------------------------------
    def _post(self, item: object) -> None:
        if not self._thread.is_alive():
            raise EngineError("The transformers engine has been shut down; create a new engine.")
        self._inbox.put(item)

    def _run(self) -> None:
        while True:
            item = self._inbox.get()
            if item is _STOP:
                self._drain_on_stop()
                return
            if item[0] == "weights":
                self._load_weights(*item[1:])
                continue
            batch = [item]
            rows = item[2].n
            while rows < self.max_batch_size:
                try:
                    nxt = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP or nxt[0] != "generate":
                    self._inbox.put(nxt)  # handled after this batch, keeping the batch's weights consistent
                    break
                batch.append(nxt)
                rows += nxt[2].n
            self._decode(batch)

    def _decode(self, batch: list[Any]) -> None:
        import torch

        from lightning_sdk.engine.transformers.decode import Row, decode_batch

        try:  # everything that can fail is inside: this worker thread must outlive any one bad batch
            rows = []
            for _, prompt, params, stream in batch:
                seed = (
                    params.seed
                    if params.seed is not None
                    else int(torch.randint(2**31, (1,), generator=self._seeds))
                )
                for index in range(params.distinct_samples):  # greedy n > 1: one row, copied by the stream
                    # On the model's device: torch.multinomial refuses a CPU generator for CUDA
                    # probabilities ("Expected a 'cuda' device type for generator"; the H200 fit check).
                    generator = torch.Generator(device=self.device).manual_seed(seed + index)
                    rows.append(Row(prompt, params, index, stream.push, generator, _cancelled_check(stream)))
            decode_batch(self._model, self._tokenizer, rows, self._eos_ids, self._pad_id)
        except Exception as error:  # noqa: BLE001 - reported to each waiting caller
            for *_, stream in batch:
                stream.fail(EngineError(f"Generation failed: {error}"))
            return
        for *_, stream in batch:
            stream.finish()

    def _load_weights(self, state: dict[str, Any], done: queue.SimpleQueue[BaseException | None]) -> None:
        try:
            import torch

            # state_dict() also names tied weights (lm_head.weight), sharing storage with the parameters.
            targets = self._model.state_dict()
            unknown = [name for name in state if name not in targets]
            if unknown:
                raise KeyError(f"Weights not in the model: {unknown[:5]}")
            with torch.no_grad():
                for name, tensor in state.items():
                    targets[name].copy_(tensor)
        except Exception as error:  # noqa: BLE001 - re-raised in the caller's thread
            done.put(error)
            return
        done.put(None)

    def _drain_on_stop(self) -> None:
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if item is not _STOP and item[0] == "generate":
                item[3].fail(EngineError("The engine was shut down before the request ran."))


def _torch_dtype(dtype: str, device: str) -> torch.dtype:
    import torch

    torch_dtype: torch.dtype = getattr(torch, auto_dtype(device) if dtype == "auto" else dtype)
    return torch_dtype


def _explicit_device(device: str) -> str:
    # The current GPU is per thread, and the engine decodes on its own thread: name the index.
    if device == "cuda":
        import torch

        return f"cuda:{torch.cuda.current_device()}"
    return device


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    generation_eos = getattr(model.generation_config, "eos_token_id", None)
    if generation_eos is not None:
        ids.update(generation_eos if isinstance(generation_eos, list) else [generation_eos])
    return ids


def _cancelled_check(stream: RequestStream) -> Callable[[], bool]:
    """Whether the request of `stream` was cancelled (its caller went away), asked at each step."""
    return lambda: stream.cancelled
