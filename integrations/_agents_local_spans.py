"""Agent attribution that does not depend on the Agents SDK's trace export setting.

Users of local models switch the SDK's tracing off (`set_tracing_disabled(True)`,
`OPENAI_AGENTS_DISABLE_TRACING=1`, or `RunConfig(tracing_disabled=True)`) so that nothing is sent to
OpenAI. The SDK then makes no-op traces and spans, and no processor, ours included, learns which agent
made a model call. `LocalSpansProvider` wraps the SDK's trace provider: whenever that provider would hand
out a no-op trace because tracing is off, it hands out a real one whose spans go to one local processor
only (our attribution), never to the exporters. With tracing on, everything goes to the SDK's provider
unchanged.
"""

from __future__ import annotations

from typing import Any

from agents.tracing import Span, Trace, TraceProvider, TracingProcessor
from agents.tracing.spans import SpanImpl
from agents.tracing.traces import NoOpTrace, TraceImpl

__all__ = ["LocalSpansProvider"]


class _LocalTrace(TraceImpl):
    """A trace made while tracing is off: only the local processor sees it and its spans."""


class _LocalSpan(SpanImpl[Any]):
    """A span inside a `_LocalTrace`."""


class LocalSpansProvider(TraceProvider):
    """The SDK's trace provider, plus local-only traces where it would make no-op ones (module doc)."""

    def __init__(self, inner: TraceProvider, local: TracingProcessor) -> None:
        self.inner = inner
        self._local = local

    def create_trace(
        self,
        name: str,
        trace_id: str | None = None,
        group_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        disabled: bool = False,
        tracing: Any = None,
    ) -> Trace:
        made = self.inner.create_trace(name, trace_id, group_id, metadata, disabled, tracing)
        if not isinstance(made, NoOpTrace):
            return made
        # No tracing API key: nothing made here may ever be exported.
        return _LocalTrace(name, trace_id or self.inner.gen_trace_id(), group_id, metadata, self._local)

    def create_span(
        self,
        span_data: Any,
        span_id: str | None = None,
        parent: Trace | Span[Any] | None = None,
        disabled: bool = False,
    ) -> Span[Any]:
        ids = _local_parent(parent)
        if ids is None:
            return self.inner.create_span(span_data, span_id, parent, disabled)
        trace_id, parent_id = ids
        return _LocalSpan(
            trace_id=trace_id,
            span_id=span_id or self.inner.gen_span_id(),
            parent_id=parent_id,
            processor=self._local,
            span_data=span_data,
            tracing_api_key=None,
        )

    # Everything else is the SDK provider's business.
    def register_processor(self, processor: TracingProcessor) -> None:
        self.inner.register_processor(processor)

    def set_processors(self, processors: list[TracingProcessor]) -> None:
        self.inner.set_processors(processors)

    def get_current_trace(self) -> Trace | None:
        return self.inner.get_current_trace()

    def get_current_span(self) -> Span[Any] | None:
        return self.inner.get_current_span()

    def set_disabled(self, disabled: bool) -> None:
        self.inner.set_disabled(disabled)

    def time_iso(self) -> str:
        return self.inner.time_iso()

    def gen_trace_id(self) -> str:
        return self.inner.gen_trace_id()

    def gen_span_id(self) -> str:
        return self.inner.gen_span_id()

    def gen_group_id(self) -> str:
        return self.inner.gen_group_id()

    def force_flush(self) -> None:
        self.inner.force_flush()

    def shutdown(self) -> None:
        self.inner.shutdown()

    def __getattr__(self, name: str) -> Any:
        # Methods a newer SDK adds to its provider, and its private state (`_multi_processor`).
        return getattr(self.inner, name)


def _local_parent(parent: Trace | Span[Any] | None) -> tuple[str, str | None] | None:
    """(trace id, parent span id) when the new span belongs to a local trace, else None."""
    from agents.tracing.scope import Scope

    if parent is None:
        span, trace = Scope.get_current_span(), Scope.get_current_trace()
        if isinstance(span, _LocalSpan):
            return span.trace_id, span.span_id
        return (trace.trace_id, None) if isinstance(trace, _LocalTrace) else None
    if isinstance(parent, _LocalSpan):
        return parent.trace_id, parent.span_id
    return (parent.trace_id, None) if isinstance(parent, _LocalTrace) else None
