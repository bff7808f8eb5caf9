"""Continuous batching for an in-process vLLM `LLMEngine`: one thread owns the engine and steps it.

Requests from any thread or event loop are queued as commands; between two engine steps the thread adds
them, so a request that arrives while others decode joins the running batch at the next step. Weight
updates and other engine calls run on the same thread, between steps, so vLLM is never used concurrently.
A request that arrives while the engine sleeps is held here and handed to vLLM when it wakes, with the
LoRA adapter that answers its name then: weights and adapters loaded meanwhile apply to it whole.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from lightning_sdk.engine.streams import RequestStream
from lightning_sdk.engine.types import CompletionDelta, EngineError, WeightVersion

if TYPE_CHECKING:
    from vllm import SamplingParams, TokensPrompt
    from vllm.lora.request import LoRARequest
    from vllm.v1.engine.llm_engine import LLMEngine

__all__ = ["StepLoop", "to_deltas"]

log = logging.getLogger(__name__)
T = TypeVar("T")
_STOP = object()


class StepLoop:
    """Owns a vLLM `LLMEngine` on a dedicated daemon thread."""

    def __init__(
        self,
        engine: LLMEngine,
        before_step: Callable[[], None] | None = None,
        on_start: Callable[[], None] | None = None,
    ) -> None:
        self._engine = engine
        self._before_step = before_step
        self._on_start = on_start
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._streams: dict[str, tuple[RequestStream, bool]] = {}
        self._held: dict[str, tuple[Callable[[], None], RequestStream]] = {}  # arrived while asleep
        self._when_idle: list[Callable[[], None]] = []  # commands waiting for the running requests to end
        self._dead: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="lightning-sdk-vllm", daemon=True)
        self._thread.start()

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        lora: Callable[[], tuple[LoRARequest | None, WeightVersion]],
        stream: RequestStream,
    ) -> None:
        """Queue a request (with vLLM `SamplingParams`); its outputs go to `stream`. `lora` gives the LoRA
        request that answers it and the weights version that does, asked when the request reaches vLLM
        (on the engine thread); the version goes to `stream.answered_by`."""
        with_top = bool(params.logprobs)
        prompt: TokensPrompt = {"prompt_token_ids": list(prompt_token_ids)}

        def add() -> None:
            if self._dead is not None:
                stream.fail(EngineError(f"The vLLM engine stopped after an error: {self._dead}"))
                return
            if self._engine.is_sleeping():
                self._held[request_id] = (add, stream)
                return
            lora_request, version = lora()
            stream.answered_by = (version,)
            try:
                self._engine.add_request(request_id, prompt, params, lora_request=lora_request)
            except Exception as error:  # noqa: BLE001 - reported to the caller, who turns it into a 4xx/5xx
                stream.fail(_as_request_error(error))
                return
            self._streams[request_id] = (stream, with_top)

        self._post(add)

    def abort(self, request_id: str) -> None:
        """Stop a request early (its caller went away)."""

        def abort() -> None:
            self._held.pop(request_id, None)
            if self._streams.pop(request_id, None) is not None:
                self._engine.abort_request([request_id])

        self._post(abort)

    def call(self, function: Callable[[Any], T], timeout: float | None = None) -> T:
        """Run `function(engine)` on the engine thread between two steps and return its result."""
        return self._call(function, timeout, when_idle=False)

    def call_when_idle(self, function: Callable[[Any], T], timeout: float | None = None) -> T:
        """Like `call`, but only once no request is running: the requests in flight finish first.

        Requests that arrive meanwhile join the running batch and are waited for too.
        """
        return self._call(function, timeout, when_idle=True)

    def _call(self, function: Callable[[Any], T], timeout: float | None, when_idle: bool) -> T:
        if threading.current_thread() is self._thread:
            return function(self._engine)
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(function(self._engine))
            except BaseException as error:  # noqa: BLE001 - re-raised in the calling thread
                future.set_exception(error)

        self._post((lambda: self._when_idle.append(run)) if when_idle else run)
        return self._wait(future, timeout)

    def _wait(self, future: concurrent.futures.Future[T], timeout: float | None) -> T:
        # Poll, so that a caller whose command the thread never ran (it stopped first) is not left waiting.
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = 0.5 if deadline is None else min(0.5, max(deadline - time.monotonic(), 0.0))
            try:
                return future.result(wait)
            except concurrent.futures.TimeoutError:
                if not self._thread.is_alive() and not future.done():
                    raise EngineError("The vLLM engine stopped before it ran the call.") from None
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    def stop(self, timeout: float = 30.0) -> None:
        """Fail pending requests and end the thread."""
        if self._thread.is_alive():
            self._inbox.put(_STOP)
            self._thread.join(timeout)

    @property
    def busy(self) -> bool:
        """True while requests are in flight (or held for the wake)."""
        return bool(self._streams or self._held)

    def _post(self, command: Callable[[], None]) -> None:
        if not self._thread.is_alive():
            raise EngineError("The vLLM engine has been shut down; create a new engine.")
        self._inbox.put(command)

    def _run(self) -> None:
        if self._on_start is not None:
            try:
                self._on_start()
            except Exception as error:
                log.exception("vLLM engine thread could not start")
                self._dead = error
        while True:
            try:
                if not self._run_once():
                    return
            except Exception as error:  # every waiting caller learns about it, and so do later ones
                log.exception("vLLM engine step failed")
                self._dead = error
                self._fail_all(EngineError(f"The vLLM engine failed: {error}"))

    def _steppable(self) -> bool:
        # A sleeping engine keeps the requests that arrive but schedules none until it wakes: stepping it
        # would only spin, taking a core from the training that runs meanwhile.
        engine = self._engine
        return self._dead is None and engine.has_unfinished_requests() and not engine.is_sleeping()

    def _run_once(self) -> bool:
        """Run the commands that have arrived, then one engine step; False once asked to stop."""
        # Block while idle; while requests decode (or calls wait to run when idle), only pick up what has
        # already arrived.
        commands = [] if self._steppable() or self._when_idle else [self._inbox.get()]
        while True:
            try:
                commands.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        for command in commands:
            if command is _STOP:
                self._fail_all(EngineError("The engine was shut down while the request was running."))
                return False
            command()
            self._release_held()  # right after the command that woke the engine: in arrival order
        if self._steppable():
            self._step()
        elif self._when_idle:  # nothing running (asleep, or the engine is broken: the calls report that)
            waiting, self._when_idle = self._when_idle, []
            for command in waiting:
                command()
        return True

    def _step(self) -> None:
        if self._before_step is not None:
            self._before_step()
        outputs = self._engine.step()
        for output in outputs:
            entry = self._streams.get(output.request_id)
            if entry is None:
                continue  # Aborted by its caller.
            stream, with_top = entry
            for delta in to_deltas(output, with_top):
                stream.push(delta)
            if output.finished:
                del self._streams[output.request_id]
                stream.finish()

    def _release_held(self) -> None:
        """Hand the requests held while the engine slept to vLLM, oldest first, once it is awake."""
        while self._held and not self._engine.is_sleeping():
            add, _ = self._held.pop(next(iter(self._held)))
            add()

    def _fail_all(self, error: BaseException) -> None:
        held, self._held = self._held, {}
        for _, stream in held.values():
            stream.fail(error)
        streams, self._streams = self._streams, {}
        for request_id, (stream, _) in streams.items():
            stream.fail(error)
            try:
                self._engine.abort_request([request_id])
            except Exception:  # the engine may already be broken; the callers know
                log.debug("abort after failure did not work", exc_info=True)


def to_deltas(output: Any, with_top: bool) -> list[CompletionDelta]:
    """Convert one vLLM `RequestOutput` (DELTA or FINAL_ONLY output kind) into our deltas.

    vLLM always returns the sampled token's logprob beside the requested alternatives; `with_top` keeps the
    alternatives (only when the request asked for some).
    """
    deltas = []
    for completion in output.outputs:
        token_ids = list(completion.token_ids)
        logprobs: list[float] = []
        top: list[dict[int, float]] | None = [] if with_top else None
        for token_id, candidates in zip(token_ids, completion.logprobs or ()):
            logprobs.append(float(candidates[token_id].logprob))
            if top is not None:
                top.append({int(tid): float(lp.logprob) for tid, lp in candidates.items()})
        finish = completion.finish_reason
        deltas.append(
            CompletionDelta(
                index=completion.index,
                token_ids=token_ids,
                logprobs=logprobs,
                text=completion.text,
                finish_reason=None if finish is None else str(finish),
                top_logprobs=top,
            )
        )
    return deltas


def _as_request_error(error: Exception) -> Exception:
    """vLLM's errors about the request itself (a schema its grammar backend cannot compile, ...) as a
    `ValueError`, which callers report as bad input (a 400), not as an engine failure."""
    from vllm.exceptions import VLLMClientError

    return ValueError(str(error)) if isinstance(error, VLLMClientError) else error
