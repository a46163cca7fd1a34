"""Publishing: one commit to a stand-in Hub reached through HF_ENDPOINT; the card makes
`load_dataset(repo)` load the episodes; the token goes only into the Authorization header."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import datasets
import huggingface_hub
import pytest
import yaml

from rollwire.datasets import hub
from rollwire.datasets.export import COLUMNS
from rollwire.datasets.hub import (
    HubAuthError,
    HubConflictError,
    HubError,
    push_collection,
    redact,
    resolve_endpoint,
    reward_histogram,
)
from rollwire.datasets.store import EpisodeStore
from tests.datasets.fake_hub import FakeHub
from tests.datasets.samples import make_record
from tests.fakes.serve import serve_in_thread

TOKEN = "hf_standInToken1234567890abcdef"
REPO = "alice/chain-sum-rollouts"
CONFIG = {
    "tasks": ["chain_sum"],
    "samples": 3,
    "llm": {"base_url": "http://x", "api_key": "sk-live"},
}


@pytest.fixture(autouse=True)
def no_hub_telemetry(monkeypatch):
    """huggingface_hub fetches an agent registry for its User-Agent from constants.ENDPOINT
    (huggingface.co unless HF_ENDPOINT was set before import): keep tests off the internet."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_TELEMETRY", True)


@pytest.fixture
def collection(tmp_path):
    path = tmp_path / "collection"
    with EpisodeStore(path, config=CONFIG, model="smollm2-135m", engine_tier="tokens") as store:
        for i, reward in enumerate([1.0, 0.0, 1.0, None]):
            store.write_episode(make_record(i, reward=reward))
    return path


@pytest.fixture
def fake_hub(monkeypatch) -> Iterator[tuple[FakeHub, str]]:
    fake = FakeHub(token=TOKEN)
    with serve_in_thread(fake.app()) as url:
        # huggingface_hub read HF_ENDPOINT at import; the push reads it at call time.
        monkeypatch.setenv("HF_ENDPOINT", url)
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        yield fake, url


def _front_matter(card: str) -> dict:
    _, front, _ = card.split("---\n", 2)
    return yaml.safe_load(front)


def test_push_creates_a_private_dataset_repo_and_commits_every_file_once(
    collection, fake_hub, tmp_path, caplog, capsys
):
    fake, url = fake_hub
    for name in (None, "huggingface_hub", "httpx", "httpx2", "rollwire"):
        caplog.set_level(logging.DEBUG, logger=name)
    result = push_collection(collection, REPO, private=True, commit_message="first collection")

    assert result.sent and result.commit_oid and result.commit_url.startswith(url)
    repo = fake.repos[REPO]
    assert repo.private and repo.repo_type == "dataset"
    assert [c["summary"] for c in repo.commits] == ["first collection"]
    shard = "data/train-00000-of-00001.parquet"
    assert sorted(repo.files) == sorted(["README.md", "manifest.json", shard])
    assert [f.path_in_repo for f in result.plan.files] == ["README.md", "manifest.json", shard]
    assert {f.path_in_repo: f.size for f in result.plan.files} == {
        p: len(b) for p, b in repo.files.items()
    }
    assert [r.path for r in fake.requests] == [
        "/api/repos/create",
        "/api/validate-yaml",
        f"/api/datasets/{REPO}/preupload/main",
        f"/api/datasets/{REPO}/commit/main",
    ]
    assert all(r.headers["authorization"] == f"Bearer {TOKEN}" for r in fake.requests)

    card = repo.files["README.md"].decode()
    front = _front_matter(card)
    assert front["configs"] == [
        {
            "config_name": "default",
            "data_files": [{"split": "train", "path": "data/train-*.parquet"}],
        }
    ]
    assert "smollm2-135m" in card and "sk-live" not in card and "<redacted>" in card
    assert "| 3 | 0.6667 | 0.4714 | 0 | 1 | 1 |" in card  # rewards 1, 0, 1 and one None
    assert "| 0 | 1 |" in card and "| 1 | 2 |" in card  # the histogram's rows
    assert b"sk-live" not in repo.files["manifest.json"]

    # What was published loads with `datasets`, through the card's configs.
    local = tmp_path / "downloaded"
    for path, data in repo.files.items():
        (local / path).parent.mkdir(parents=True, exist_ok=True)
        (local / path).write_bytes(data)
    episodes = datasets.load_dataset(str(local), split="train", cache_dir=str(tmp_path / "hf"))
    assert episodes.num_rows == 4 and episodes.column_names == list(COLUMNS)
    assert [row["reward"] for row in episodes] == [1.0, 0.0, 1.0, None]
    assert episodes[0]["sequences"][1]["loss_mask"] == make_record(0).sequences[1].loss_mask

    leaked = [caplog.text, *capsys.readouterr(), result.model_dump_json(), result.plan.describe()]
    assert not any(TOKEN in text for text in leaked)


def test_dry_run_sends_nothing_and_shows_everything_but_the_token(collection, fake_hub, capsys):
    fake, url = fake_hub
    result = push_collection(collection, REPO, private=False, dry_run=True)
    assert not result.sent and fake.requests == []
    plan = result.plan
    assert (plan.endpoint, plan.repo_id, plan.private, plan.token_found) == (url, REPO, False, True)
    assert plan.n_rows == 4 and "4 episodes" in plan.commit_message
    text = plan.describe()
    assert "public" in text and "data/train-00000-of-00001.parquet" in text and plan.card in text
    assert TOKEN not in text and TOKEN not in result.model_dump_json()
    assert TOKEN not in "".join(capsys.readouterr())


def test_no_token_is_a_clear_error_before_anything_is_sent(
    collection, fake_hub, monkeypatch, tmp_path
):
    fake, _ = fake_hub
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    with pytest.raises(HubAuthError, match="no Hugging Face token"):
        push_collection(collection, REPO)
    assert fake.requests == []
    assert push_collection(collection, REPO, dry_run=True).plan.token_found is False


def test_a_refused_token_is_an_auth_error_that_does_not_echo_it(collection, fake_hub):
    wrong = "hf_wrongToken000000000000000000"
    with pytest.raises(HubAuthError, match="401") as info:
        push_collection(collection, REPO, token=wrong)
    assert wrong not in str(info.value) and REPO in str(info.value)


def test_a_commit_conflict_is_a_conflict_error(collection, fake_hub):
    fake, _ = fake_hub
    fake.commit_status = 412
    with pytest.raises(HubConflictError, match="412"):
        push_collection(collection, REPO)


def test_pushing_again_to_an_existing_repo_commits_to_it(collection, fake_hub):
    fake, _ = fake_hub
    push_collection(collection, REPO)
    push_collection(collection, REPO, commit_message="again")
    assert [c["summary"] for c in fake.repos[REPO].commits][-1] == "again"


def test_an_unreachable_endpoint_names_it(collection, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    with pytest.raises(HubError, match=r"cannot reach the Hub at http://127\.0\.0\.1:9") as info:
        push_collection(collection, REPO, endpoint="http://127.0.0.1:9")
    assert TOKEN not in str(info.value)


def test_endpoint_is_the_argument_then_hf_endpoint_now_then_the_library_default(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://env.example/")
    assert resolve_endpoint("http://arg.example/") == "http://arg.example"
    assert resolve_endpoint() == "http://env.example"
    monkeypatch.delenv("HF_ENDPOINT")
    assert resolve_endpoint() == huggingface_hub.constants.ENDPOINT


def test_secrets_in_the_config_are_redacted_at_any_depth():
    config = {"llm": {"api_key": "sk", "base_url": "u"}, "hf_token": "t", "runs": [{"password": 1}]}
    assert redact(config) == {
        "llm": {"api_key": "<redacted>", "base_url": "u"},
        "hf_token": "<redacted>",
        "runs": [{"password": "<redacted>"}],
    }


def test_reward_histogram_lists_few_distinct_values_exactly_and_bins_many():
    assert [(b.label, b.count) for b in reward_histogram([0.0, 1.0, 1.0])] == [("0", 1), ("1", 2)]
    binned = reward_histogram([i / 100 for i in range(100)], bins=10)
    assert len(binned) == 10 and sum(b.count for b in binned) == 100
    assert binned[-1].label.endswith("]") and reward_histogram([]) == []


def test_a_directory_without_a_manifest_is_not_pushed(tmp_path):
    with pytest.raises(HubError, match="not a rollwire collection"):
        hub.push_collection(tmp_path, REPO, dry_run=True)
