"""A scripted model for reasoning-gym's ``chain_sum`` on the fake engine (``FakeVLLM(policy=)``):
it works the sum out (``examples/chain_sum_teacher.py``) and answers through the ``answer``
tool, wrong where ``wrong(answer, body)`` says so: rewards that are real verifier verdicts,
right and wrong in a known pattern."""

from __future__ import annotations

import functools
import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.fakes.vllm import tool_call_text

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def teacher() -> Any:
    """``examples/chain_sum_teacher.py`` as a module (it is a script, not a package)."""
    spec = importlib.util.spec_from_file_location(
        "chain_sum_teacher", ROOT / "examples" / "chain_sum_teacher.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def multiple_of_3(answer: int, body: dict[str, Any]) -> bool:
    """Wrong on every problem whose sum is a multiple of 3."""
    return answer % 3 == 0


def by_sampling_seed(answer: int, body: dict[str, Any]) -> bool:
    """Wrong when the request's sampling seed is a multiple of 3: samples of one problem
    differ, so pass@k grows with k."""
    return int(body.get("seed") or 0) % 3 == 0


def chain_sum_solver(
    wrong: Callable[[int, dict[str, Any]], bool] = multiple_of_3,
) -> Callable[[dict[str, Any]], str | None]:
    """The policy: a tool call answering the sum (plus one where ``wrong``); None (the fake's
    usual reply) for anything that is not a chain_sum problem with an ``answer`` tool."""

    def policy(body: dict[str, Any]) -> str | None:
        message = teacher().reply(body)
        calls = message.get("tool_calls")
        if not calls:
            return None
        answer = int(json.loads(calls[0]["function"]["arguments"])["answer"])
        if wrong(answer, body):
            answer += 1
        return tool_call_text("answer", {"answer": str(answer)})

    return policy
