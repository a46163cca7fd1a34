"""Each extra installs alone and works alone: the core plus one extra, in its own environment
(from uv.lock, nothing else), runs that extra's smallest real use.

A missing dependency of an extra (something the dev group happens to install for every test)
fails here, not on a user's machine.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.datasets.samples import make_record
from tests.fakes.spawn import free_port
from tests.packaging.envs import ROOT, clean_env, project_env, python_prints, run

pytestmark = pytest.mark.slow

ENV_FAMILIES = {"reasoning_gym", "openspiel", "textarena", "browsergym"}


def _json(done: subprocess.CompletedProcess[str]) -> dict:
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def core_reports_every_missing_family(env: Path, tmp: Path) -> None:
    """No extra: the CLI runs and names what is missing instead of crashing."""
    report = _json(run(env, "rollwire", "info", "--json", cwd=tmp))
    families = report["env_families"]
    assert set(families) == ENV_FAMILIES
    for family, state in families.items():
        assert state["available"] is False, family
        assert state["reason"], family


def engine_answers_with_token_ids_and_logprobs(env: Path, tmp: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [str(env / "bin" / "rollwire"), "engine", "--port", str(port), "--threads", "1"],
        cwd=tmp,
        env=clean_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        root = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + 120
        while True:
            try:
                models = httpx.get(root + "/models", timeout=2).json()
                break
            except httpx.HTTPError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                assert time.monotonic() < deadline, "the engine did not answer in 120 s"
                time.sleep(0.5)
        model = models["data"][0]["id"]
        reply = httpx.post(
            root + "/chat/completions",
            json={
                "model": model,
                "messages": [{"role": "user", "content": "Say hi."}],
                "max_tokens": 4,
                "logprobs": True,
                "return_token_ids": True,
            },
            timeout=60,
        ).json()
        choice = reply["choices"][0]
        assert len(choice["logprobs"]["content"]) == len(choice["token_ids"]) > 0
        assert all(t["logprob"] <= 0.0 for t in choice["logprobs"]["content"])
        assert reply["prompt_token_ids"]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def envs_list_every_classic_family(env: Path, tmp: Path) -> None:
    listing = _json(run(env, "rollwire", "tasks", "--json", cwd=tmp))
    families = {t["family"] for t in listing["tasks"]}
    assert families == {"reasoning_gym", "openspiel", "textarena"}, listing["unavailable"]
    assert "browsergym" in listing["unavailable"]
    assert any(t["task"] == "reasoning_gym:chain_sum" for t in listing["tasks"])


def harbor_resolves_the_bundled_tasks(env: Path, tmp: Path) -> None:
    tasks = ROOT / "examples" / "tasks"
    report = _json(run(env, "rollwire", "info", "--json", "--dataset", str(tasks), cwd=tmp))
    [dataset] = report["datasets"]
    assert dataset.get("tasks") == 6, dataset
    assert any(s["name"] == "local" for s in report["sandboxes"]), report["sandboxes"]


def datasets_export_a_collection_to_parquet(env: Path, tmp: Path) -> None:
    from rollwire.datasets.store import EpisodeStore

    with EpisodeStore(tmp / "c", config={"c": 1}) as store:
        for i in range(3):
            store.write_episode(make_record(i, reward=float(i % 2)))
    done = run(env, "rollwire", "export", str(tmp / "c"), "--out", str(tmp / "out"), cwd=tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = python_prints(
        env,
        "import pyarrow.parquet as pq, glob, sys; "
        "print(sum(pq.read_table(f).num_rows for f in glob.glob(sys.argv[1])))",
        str(tmp / "out" / "train-*.parquet"),
        cwd=tmp,
    )
    assert rows == "3"


def train_converts_the_gguf_to_a_hugging_face_folder(env: Path, tmp: Path) -> None:
    from rollwire.engine.model import default_model_path

    gguf = default_model_path()  # the dev environment's copy of the engine extra's model file
    out = tmp / "hf"
    done = run(env, "rollwire", "convert", "--gguf", str(gguf), "--out", str(out), cwd=tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = python_prints(
        env,
        "import sys, torch, transformers as t; m = t.AutoModelForCausalLM.from_pretrained("
        "sys.argv[1]); tok = t.AutoTokenizer.from_pretrained(sys.argv[1]); "
        "ids = tok('2+2=', return_tensors='pt').input_ids; "
        "print(m(ids).logits.shape[-1] == m.config.vocab_size)",
        str(out),
        cwd=tmp,
    )
    assert loaded.endswith("True")


RAY_SCRIPT = """
import os, sys
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # bind loopback only (tests/scale/conftest.py)
import ray
from ray.cluster_utils import Cluster
from rollwire.collect.cluster import connect

cluster = Cluster(
    initialize_head=True,
    head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False},
)
try:
    connect(cluster.address)
    print(ray.get(ray.remote(lambda: 6 * 7).remote()))
finally:
    ray.shutdown()
    cluster.shutdown()
"""


def ray_joins_a_cluster_and_runs_a_task(env: Path, tmp: Path) -> None:
    """rollwire's driver connection to a head of this environment's own Ray (a cluster this
    process owns and shuts down; never `ray stop`, which would stop every Ray on the machine)."""
    assert python_prints(env, RAY_SCRIPT, cwd=tmp).splitlines()[-1] == "42"


def browser_lists_the_miniwob_tasks(env: Path, tmp: Path) -> None:
    listing = _json(run(env, "rollwire", "tasks", "--family", "browsergym", "--json", cwd=tmp))
    names = {t["task"] for t in listing["tasks"]}
    assert "browsergym:miniwob.click-test" in names, sorted(names)[:5]


#: extra (None: the core alone) → its smallest real use
USES: dict[str | None, Callable[[Path, Path], None]] = {
    None: core_reports_every_missing_family,
    "engine": engine_answers_with_token_ids_and_logprobs,
    "envs": envs_list_every_classic_family,
    "harbor": harbor_resolves_the_bundled_tasks,
    "datasets": datasets_export_a_collection_to_parquet,
    "train": train_converts_the_gguf_to_a_hugging_face_folder,
    "ray": ray_joins_a_cluster_and_runs_a_task,
    "browser": browser_lists_the_miniwob_tasks,
}


def test_every_extra_of_pyproject_is_covered() -> None:
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert set(extras) == {e for e in USES if e is not None}


# (the Ray case starts a cluster on loopback: tests/conftest.py's SHARED_RESOURCES gives it the
# worker of tests/scale's clusters)
@pytest.mark.parametrize("extra", list(USES), ids=lambda e: e or "core")
def test_extra_installs_alone_and_works_alone(extra: str | None, tmp_path: Path) -> None:
    env = project_env(tmp_path / "venv", *([extra] if extra else []))
    work = tmp_path / "work"
    work.mkdir()
    USES[extra](env, work)


def test_a_command_without_its_extra_names_the_extra_to_install(tmp_path: Path) -> None:
    from rollwire.datasets.store import EpisodeStore

    env = project_env(tmp_path / "venv")
    with EpisodeStore(tmp_path / "c", config={"c": 1}) as store:
        store.write_episode(make_record(0))
    done = run(env, "rollwire", "export", str(tmp_path / "c"), cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert "needs the datasets extra" in done.stderr
    assert "pip install 'rollwire[datasets]'" in done.stderr
