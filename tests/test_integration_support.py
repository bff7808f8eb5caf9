"""What the three integrations share: the missing-framework error and the supported-version warning."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

from lightning_sdk.integrations import _support


@pytest.mark.parametrize(
    ("module", "framework_module", "extra"),
    [
        ("langchain", "langchain_core", "langchain"),
        ("autogen", "autogen_agentchat", "autogen"),
        ("openai_agents", "agents", "openai-agents"),
    ],
)
def test_a_missing_framework_names_the_install_command(monkeypatch, module, framework_module, extra):
    # A None entry is what Python's import system reports as not installed; submodules imported by
    # earlier tests would otherwise still be found.
    for name in [n for n in sys.modules if n == framework_module or n.startswith(f"{framework_module}.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, framework_module, None)
    monkeypatch.delitem(sys.modules, f"lightning_sdk.integrations.{module}", raising=False)
    with pytest.raises(ImportError, match=rf"pip install 'lightning-sdk\[{extra}\]'"):
        importlib.import_module(f"lightning_sdk.integrations.{module}")


def test_a_version_outside_the_supported_range_warns_once(monkeypatch):
    monkeypatch.setattr(_support, "_checked", set())
    with pytest.warns(
        RuntimeWarning, match=r"tested with langchain-core >=9.0,<10.*lightning-sdk\[langchain\]"
    ):
        _support.check_version("langchain-core", "9.0", "10", extra="langchain")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _support.check_version("langchain-core", "9.0", "10", extra="langchain")  # said once is enough
        _support.check_version("openai-agents", "0.20", "1", extra="openai-agents")  # the installed one fits
    assert _support._checked == {"langchain-core", "openai-agents"}


@pytest.mark.parametrize(
    ("version", "expected"),
    [("1.7.2", (1, 7, 2)), ("0.24", (0, 24)), ("2.0.0rc1", (2, 0, 0)), ("1.0a3", (1, 0))],
)
def test_version_parsing(version, expected):
    assert _support._version_tuple(version) == expected


def test_a_link_names_its_agent_while_open_and_closes_from_any_context() -> None:
    import contextvars

    from lightning_sdk.tracing.context import call_attributes, current_call_attributes

    with call_attributes(metadata={"outer": "1"}):
        link = _support.CallLink("run", "r1", agent_name="writer").open()
        # The router reads the name when the request is made, before the framework's end callback.
        assert current_call_attributes() == {"agent_name": "writer", "metadata": {"outer": "1", "run": "r1"}}
        contextvars.copy_context().run(link.close)  # an end callback in a child task's context
        assert current_call_attributes() == {"metadata": {"outer": "1"}}  # the scope left behind is inert
        link.close()  # and closing again does nothing
        assert current_call_attributes() == {"metadata": {"outer": "1"}}
    assert current_call_attributes() == {}
