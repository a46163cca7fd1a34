"""Weight sync into the reference engine, in vLLM's RL shape, on the real torch engine.

A checkpoint swaps in whole and the version follows; a bad one is refused with an error naming
what is wrong and the old weights keep serving; a call in flight finishes on the weights it
started with, or is aborted or frozen as /pause's mode says. The model here is a fresh
``HFModel`` of the converted SmolLM2 folder (the session's shared one is never touched)."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollwire.engine.server import create_engine_app
from tests.conftest import SERVED
from tests.fakes.serve import serve_in_thread

pytestmark = pytest.mark.slow

KEY = "engine-admin-key"
ADMIN = {"Authorization": f"Bearer {KEY}"}
PROMPT = [{"role": "user", "content": "Count from one to ten."}]


@pytest.fixture(scope="module")
def original(converted_dir: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(converted_dir / "model.safetensors"))


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The engine's weights root, and a folder outside it."""
    return tmp_path_factory.mktemp("weights-root"), tmp_path_factory.mktemp("elsewhere")


@pytest.fixture(scope="module")
def engine(converted_dir: Path, roots: tuple[Path, Path]) -> Iterator[tuple[str, Any]]:
    from rollwire.engine.hf import HFModel

    model = HFModel(converted_dir, n_ctx=2048)
    app = create_engine_app(model, served_name=SERVED, admin_key=KEY, weights_roots=[roots[0]])
    with serve_in_thread(app) as url:
        yield url, app.state.engine


def save(folder: Path, tensors: dict[str, Any]) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def scaled_norm(original: dict[str, Any], factor: float = 1.5) -> dict[str, Any]:
    out = dict(original)
    out["model.norm.weight"] = original["model.norm.weight"] * factor
    return out


def chat(url: str, max_tokens: int = 8, **extra: Any) -> dict:
    body = {
        "model": SERVED,
        "messages": PROMPT,
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": True,
        "return_token_ids": True,
        **extra,
    }
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)
    assert reply.status_code == 200, reply.text
    return reply.json()


def logprobs(reply: dict) -> list[float]:
    return [e["logprob"] for e in reply["choices"][0]["logprobs"]["content"]]


def post(url: str, path: str, body: Any = None, **kw: Any) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, headers=ADMIN, timeout=600, **kw)


def push(url: str, update_info: dict, version: str | None = None) -> None:
    assert post(url, "/start_weight_update").status_code == 200
    reply = post(url, "/update_weights", {"update_info": update_info})
    assert reply.status_code == 200, reply.text
    done = post(url, "/finish_weight_update", {"weight_version": version} if version else None)
    assert done.status_code == 200, done.text


def b64(tensors: dict[str, Any]) -> str:
    from safetensors.torch import save

    return base64.b64encode(save(tensors)).decode()


def version(url: str) -> str:
    return httpx.get(f"{url}/weight_info").json()["weight_version"]


@pytest.fixture(scope="module")
def original_folder(original, roots) -> Path:
    """The original weights as a checkpoint folder inside the engine's weights root."""
    return save(roots[0] / "original", original)


@pytest.fixture(scope="module")
def scaled_folder(original, roots) -> Path:
    """Other weights (the final norm scaled) as a checkpoint folder in the weights root."""
    return save(roots[0] / "scaled", scaled_norm(original))


@pytest.fixture
def restored(engine, original_folder) -> Iterator[tuple[str, Any]]:
    """The engine serving the original weights as version ``original`` after the test."""
    yield engine
    url, _ = engine
    post(url, "/resume")
    push(url, {"path": str(original_folder)}, "original")


def test_a_checkpoint_folder_swaps_in_whole_and_the_version_follows(
    restored, original, scaled_folder
):
    url, _ = restored
    before = logprobs(chat(url))
    assert post(url, "/pause", params={"mode": "wait"}).json() == {"status": "paused"}
    assert httpx.get(f"{url}/is_paused").json() == {"is_paused": True}
    push(url, {"path": str(scaled_folder)}, "step-1")
    assert post(url, "/resume").json() == {"status": "resumed"}
    assert version(url) == "step-1"
    after = logprobs(chat(url))
    assert max(abs(a - b) for a, b in zip(before, after, strict=False)) > 0.05
    # the same bytes over HTTP bring the original back exactly
    push(url, {"safetensors": b64(original)}, "back")
    assert logprobs(chat(url)) == before and version(url) == "back"


def _bad(original: dict[str, Any], roots: tuple[Path, Path], case: str) -> dict:
    import torch

    root, elsewhere = roots
    if case == "a file, not a folder":
        target = save(root / "file-case", original) / "model.safetensors"
        return {"path": str(target)}
    if case == "a relative path":
        return {"path": "step-1"}
    if case == "outside the weights roots":
        return {"path": str(save(elsewhere / "ckpt", original))}
    if case == "a wrong shape":
        return {"path": str(save(root / "shape-case", {"model.norm.weight": torch.zeros(7)}))}
    # a chunk is checked as it arrives: one tensor is enough to be refused
    if case == "an unknown tensor":
        return {"safetensors": b64({"extra.weight": torch.zeros(3)})}
    if case == "an integer tensor for a float one":
        return {"safetensors": b64({"model.norm.weight": torch.zeros(576, dtype=torch.int64)})}
    if case == "a NaN in a weight":
        norm = original["model.norm.weight"].clone()
        norm[3] = float("nan")
        return {"safetensors": b64({"model.norm.weight": norm})}
    if case == "not safetensors":
        return {"safetensors": base64.b64encode(b"\x10\x00\x00\x00\x00\x00\x00\x00{}").decode()}
    if case == "a truncated file":
        from safetensors.torch import save as to_bytes

        blob = to_bytes({"model.norm.weight": original["model.norm.weight"]})
        return {"safetensors": base64.b64encode(blob[:-100]).decode()}
    if case == "not base64":
        return {"safetensors": "!!!"}
    raise AssertionError(case)


BAD = {
    "a file, not a folder": (400, "is not a folder"),
    "a relative path": (400, "absolute"),
    "outside the weights roots": (403, "outside the engine's weights roots"),
    "a wrong shape": (400, "has shape [7], served [576]"),
    "an unknown tensor": (400, "unexpected tensor 'extra.weight'"),
    "an integer tensor for a float one": (400, "is I64, served F32"),
    "a NaN in a weight": (400, "'model.norm.weight' holds NaN or inf values"),
    "not safetensors": (400, "safetensors"),
    "a truncated file": (400, "truncated or damaged"),
    "not base64": (400, "not base64"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_checkpoint_is_refused_and_the_old_weights_keep_serving(
    restored, original, roots, case
):
    url, _ = restored
    before, served = logprobs(chat(url)), version(url)
    assert post(url, "/start_weight_update").status_code == 200
    reply = post(url, "/update_weights", {"update_info": _bad(original, roots, case)})
    status, words = BAD[case]
    assert reply.status_code == status and words in reply.json()["error"]["message"], reply.text
    # the session ended with the refusal: nothing is left to finish, nothing changed
    assert post(url, "/finish_weight_update").status_code == 409
    assert version(url) == served and logprobs(chat(url)) == before


def test_an_incomplete_update_changes_nothing(restored, original):
    url, _ = restored
    before = logprobs(chat(url))
    partial = {k: v * 2 for k, v in original.items() if k == "model.norm.weight"}
    assert post(url, "/start_weight_update").status_code == 200
    assert post(url, "/update_weights", {"update_info": {"safetensors": b64(partial)}}).is_success
    done = post(url, "/finish_weight_update", {"weight_version": "half"})
    assert done.status_code == 400 and "271 served tensor(s) missing" in done.text
    assert version(url) != "half" and logprobs(chat(url)) == before


def test_weight_routes_need_the_admin_key(converted_dir, engine):
    url, _ = engine
    assert httpx.post(f"{url}/start_weight_update").status_code == 401
    wrong = httpx.post(f"{url}/pause", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert httpx.get(f"{url}/weight_info").status_code == 200  # the version is read by anyone


def test_without_an_admin_key_weight_routes_are_off(reference_model):
    app = create_engine_app(reference_model, served_name=SERVED)
    with serve_in_thread(app) as url:
        off = httpx.post(f"{url}/start_weight_update", headers=ADMIN)
        assert off.status_code == 403 and "--admin-key" in off.text
        assert httpx.get(f"{url}/weight_info").json() == {"weight_version": "default"}


def test_the_gguf_engine_refuses_weight_updates(reference_model):
    app = create_engine_app(reference_model, served_name=SERVED, admin_key=KEY)
    with serve_in_thread(app) as url:
        refused = post(url, "/start_weight_update")
        assert refused.status_code == 400 and "Hugging Face folder" in refused.text


class Background:
    """One chat call on a thread: its reply, and when it ended."""

    def __init__(self, url: str, **kw: Any) -> None:
        self.reply: dict | None = None
        self.ended: float | None = None
        self._thread = threading.Thread(target=self._run, args=(url,), kwargs=kw)
        self._thread.start()

    def _run(self, url: str, **kw: Any) -> None:
        self.reply = chat(url, **kw)
        self.ended = time.monotonic()

    def join(self, timeout: float = 600) -> dict:
        self._thread.join(timeout)
        assert self.reply is not None
        return self.reply


LONG = {"max_tokens": 160, "ignore_eos": True}


def test_a_call_in_flight_finishes_on_the_weights_it_started_with(restored, scaled_folder):
    url, _ = restored
    reference = logprobs(chat(url, **LONG))
    assert post(url, "/start_weight_update").status_code == 200
    staged = post(url, "/update_weights", {"update_info": {"path": str(scaled_folder)}})
    assert staged.is_success
    call = Background(url, **LONG)
    time.sleep(1.0)  # the call is generating
    done = post(url, "/finish_weight_update", {"weight_version": "swapped"})
    swapped_at = time.monotonic()
    assert done.is_success
    assert logprobs(call.join()) == reference  # every token from the old weights
    assert call.ended is not None and call.ended <= swapped_at  # the swap waited for it
    assert logprobs(chat(url, **LONG)) != reference


def test_pause_abort_ends_a_call_in_flight_and_later_calls_wait_for_resume(restored):
    url, _ = restored
    call = Background(url, **LONG)
    time.sleep(1.0)
    assert post(url, "/pause", params={"mode": "abort"}).is_success
    aborted = call.join()["choices"][0]
    assert aborted["finish_reason"] == "abort" and 0 < len(aborted["token_ids"]) < 160
    waiting = Background(url, max_tokens=4)
    time.sleep(1.0)
    assert waiting.reply is None  # held while paused
    assert post(url, "/resume").is_success
    assert waiting.join()["choices"][0]["finish_reason"] == "length"


def test_pause_keep_freezes_a_call_and_it_goes_on_after_resume(restored, scaled_folder):
    url, _ = restored
    reference = logprobs(chat(url, **LONG))
    call = Background(url, **LONG)
    time.sleep(1.0)
    assert post(url, "/pause", params={"mode": "keep"}).is_success
    time.sleep(0.5)
    assert call.reply is None  # frozen at a token boundary
    push(url, {"path": str(scaled_folder)}, "under-frozen")
    assert post(url, "/resume").is_success
    got = logprobs(call.join())
    assert len(got) == 160
    # its first tokens came from the old weights, the rest from the new ones (as vLLM's keep)
    assert got[0] == reference[0] and got != reference


def test_weight_checker_checksums_compare_and_reset(restored):
    url, _ = restored
    sums = post(url, "/weight_checker", {"action": "checksum"}).json()["checksums"]
    assert len(sums) == 272 and all(len(v) == 64 for v in sums.values())
    same = post(url, "/weight_checker", {"action": "compare", "baseline": sums}).json()
    assert same == {"match": True, "mismatches": []}
    assert post(url, "/weight_checker", {"action": "reset"}).json() == {"status": "reset"}
    moved = post(url, "/weight_checker", {"action": "compare", "baseline": sums}).json()
    assert not moved["match"] and len(moved["mismatches"]) == 272
