"""How runner processes find the agent: `module:function` or `file.py:function`, derived from the function."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from lightning_sdk.rollouts.runner.agents import agent_reference, load_agent


def test_a_module_function_is_found_by_its_reference(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1]))
    from tests.scripts.runner_agent import solver

    reference = agent_reference(solver)  # a @trace_agent function keeps its module and name
    assert reference == "tests.scripts.runner_agent:solver"
    assert load_agent(reference) is solver


def test_a_script_is_loaded_without_running_its_main_block(tmp_path) -> None:
    script = tmp_path / "train_my_agent.py"
    script.write_text(
        "def solve(task):\n    return task\n\n"
        "if __name__ == '__main__':\n    raise SystemExit('training started in a runner')\n"
    )
    solve = load_agent(f"{script}:solve")
    assert solve({"q": 1}) == {"q": 1}


def test_an_agent_defined_in_a_script_run_as_main_is_named_by_its_file(monkeypatch, tmp_path) -> None:
    script = tmp_path / "main_script.py"
    script.write_text("def solve(task):\n    return task\n")
    main = type(sys)("__main__")
    main.__file__ = str(script)
    monkeypatch.setitem(sys.modules, "__main__", main)

    def solve(task):  # stands for a function defined at the top of the script being run
        return task

    solve.__module__, solve.__qualname__ = "__main__", "solve"
    assert agent_reference(solve) == f"{script.resolve()}:solve"


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ("no_colon", "must look like module:function"),
        ("missing.py:f", "does not exist"),
        ("json:no_such_function", "has no attribute 'no_such_function'"),
    ],
)
def test_bad_references_are_explained(reference, message) -> None:
    with pytest.raises(ValueError, match=message):
        load_agent(reference)


def test_functions_runners_cannot_import_are_refused() -> None:
    def local(task):
        return task

    with pytest.raises(ValueError, match="not importable by name"):
        agent_reference(local)
    with pytest.raises(ValueError, match="not importable by name"):
        agent_reference(lambda task: task)
