"""The reference engine's llama.cpp is portable (the x86-64 AVX2 level, nothing the build
machine's CPU reports beyond it), and what the engine says when a CPU cannot run it or it dies.

The pure part (the system-info report, the CPU flags, the one line for an engine's death) is
tested on strings; the installed library and a CPU without AVX2 through the real engine process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollwire.engine.process import (
    CPU_FLAGS,
    CPUINFO_ENV,
    PORTABLE_FEATURES,
    REFUSED,
    beyond_portable,
    cpu_flags,
    describe_exit,
    library_features,
    no_avx2_line,
    parse_fault,
    unsupported_features,
)

# llama_print_system_info() of a native build on an AVX-512 machine (seen here), and of the
# portable one on the same machine.
NATIVE_REPORT = (
    "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
    "AVX512 = 1 | AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | LLAMAFILE = 1 | "
    "OPENMP = 1 | REPACK = 1 | "
)
PORTABLE_REPORT = (
    "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
    "LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | "
)
HASWELL_FLAGS = "fpu sse2 lm pni ssse3 sse4_1 sse4_2 avx f16c fma bmi1 avx2 bmi2"


def test_installed_llama_cpp_reports_no_instruction_set_beyond_the_portable_build() -> None:
    """What `uv sync` (pyproject's CMAKE_ARGS) built: a native build on an AVX-512 or AMX
    machine reports those here and crashes where the hypervisor does not enable them."""
    import llama_cpp

    report = llama_cpp.llama_print_system_info().decode()
    features = library_features(report)
    assert "AVX2" in features, report
    assert beyond_portable(features) == [], report


def test_system_info_parses_to_the_features_that_are_on() -> None:
    assert library_features(PORTABLE_REPORT) == PORTABLE_FEATURES | {
        "LLAMAFILE",
        "OPENMP",
        "REPACK",
    }
    assert library_features("CPU : AVX2 = 0 | AVX = 1 | ") == {"AVX"}


def test_a_native_build_is_named_by_what_it_has_beyond_portable() -> None:
    features = library_features(NATIVE_REPORT)
    assert beyond_portable(features) == ["AVX512", "AVX512_BF16", "AVX512_VBMI", "AVX512_VNNI"]


def test_features_the_cpu_does_not_enable_are_named() -> None:
    flags = cpu_flags(f"processor\t: 0\nflags\t\t: {HASWELL_FLAGS}\n")
    assert unsupported_features(library_features(PORTABLE_REPORT), flags) == []
    assert unsupported_features(library_features(NATIVE_REPORT), flags) == [
        "AVX512",
        "AVX512_BF16",
        "AVX512_VBMI",
        "AVX512_VNNI",
    ]


def test_no_avx2_line_only_for_an_x86_cpu_without_avx2() -> None:
    assert no_avx2_line(set(HASWELL_FLAGS.split())) is None
    assert no_avx2_line(None) is None  # no /proc/cpuinfo: nothing to say
    assert no_avx2_line({"fp", "asimd"}) is None  # an arm64 CPU's flags
    line = no_avx2_line(set(HASWELL_FLAGS.split()) - {"avx2"})
    assert line is not None and "AVX2" in line and "\n" not in line


@given(st.sampled_from([signal.SIGSEGV, signal.SIGILL, signal.SIGBUS, signal.SIGABRT]))
def test_a_crash_line_names_the_engine_the_signal_and_what_to_try(sig: signal.Signals) -> None:
    line = describe_exit(-sig, pid=4242, features=library_features(NATIVE_REPORT))
    assert line.startswith("rollwire: the reference engine (llama.cpp, pid 4242) died of ")
    assert sig.name in line and "try:" in line and "GGML_NATIVE=OFF" in line
    assert "AVX512_VNNI" in line  # what the build has beyond portable, where it has any
    assert "\n" not in line


def test_a_killed_engine_points_at_memory() -> None:
    line = describe_exit(-signal.SIGKILL, pid=7)
    assert "SIGKILL" in line and "OOM" in line and "\n" not in line


def test_an_engine_that_exits_by_itself_points_at_its_own_message() -> None:
    assert "exited with code 1" in describe_exit(1, pid=7)


@pytest.mark.parametrize(
    ("value", "parsed"),
    [(None, None), ("", None), ("SIGSEGV@2", (signal.SIGSEGV, 2)), ("sigill", (signal.SIGILL, 1))],
)
def test_fault_switch_parses(value: str | None, parsed: object) -> None:
    assert parse_fault(value) == parsed


@pytest.mark.parametrize("value", ["SIGNOPE@1", "SIGSEGV@x", "SIGSEGV@0"])
def test_fault_switch_refuses_a_bad_value_naming_it(value: str) -> None:
    with pytest.raises(ValueError, match=value):
        parse_fault(value)


def test_every_cpu_flag_llama_cpp_reports_is_mapped() -> None:
    for feature in library_features(NATIVE_REPORT) - {"LLAMAFILE", "OPENMP", "REPACK"}:
        assert feature in CPU_FLAGS, feature


def _without_avx2(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``rollwire ARGS`` on a CPU whose flags lack AVX2 (a copy of /proc/cpuinfo without it)."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {HASWELL_FLAGS.replace(' avx2', '')}\n")
    return subprocess.run(
        [sys.executable, "-m", "rollwire", *args],
        env={**os.environ, CPUINFO_ENV: str(cpuinfo)},
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def test_engine_on_a_cpu_without_avx2_says_so_in_one_line_before_loading(tmp_path: Path) -> None:
    """`rollwire engine` on a CPU whose flags lack AVX2 (a copy of /proc/cpuinfo without it):
    one line, exit code 2, and the model never loads."""
    done = _without_avx2(tmp_path, "engine", "--port", "0")
    assert done.returncode == REFUSED, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "needs a CPU with AVX2" in lines[0], done.stderr


def test_demo_on_a_cpu_without_avx2_says_so_in_one_line_before_loading(tmp_path: Path) -> None:
    done = _without_avx2(tmp_path, "demo", "--out", str(tmp_path / "rollout.json"))
    assert done.returncode == REFUSED, done.stderr
    lines = [line for line in done.stderr.splitlines() if "AVX2" in line]
    assert len(lines) == 1 and "needs a CPU with AVX2" in lines[0], done.stderr
    assert "2/4" not in done.stderr  # it never reached the MCP steps
    assert not (tmp_path / "rollout.json").exists()
