"""An engine sizes its thread pool to the CPUs its process may use (``taskset``, a cpuset, a
pinned test worker), not to the machine: llama.cpp threads beyond them spin against each other."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity"), reason="Linux affinity calls only"
)

PROBE = (
    "from rollwire.engine.model import ReferenceModel; "
    "print(ReferenceModel(n_ctx=512)._llm.n_threads)"
)


def _threads_on(cpus: set[int]) -> int:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True,
        preexec_fn=lambda: os.sched_setaffinity(0, cpus),
    )  # fmt: skip
    return int(done.stdout.strip().splitlines()[-1])


def test_the_reference_engine_starts_one_thread_per_cpu_it_may_use():
    one = {min(os.sched_getaffinity(0))}
    assert _threads_on(one) == 1
    everything = os.sched_getaffinity(0)
    assert _threads_on(everything) == len(everything)
