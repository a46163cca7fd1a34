"""``rollwire export --format sft``: rows TRL's SFTTrainer reads, ids verbatim from the capture,
filtering and the split by task instance exact."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anyio
import datasets
import pytest

from rollwire.collect.collection import CollectConfig, collect
from rollwire.datasets.export import ExportError, export_collection
from rollwire.datasets.sft import export_sft, sft_messages, split_of
from rollwire.datasets.store import EpisodeStore
from rollwire.server import cli
from rollwire.tools.endpoint import EndpointPool
from rollwire.tools.rollouts import Limits, LLMSpec, Sampling
from tests.datasets.samples import make_record
from tests.fakes.serve import serve_in_thread
from tests.fakes.vllm import FakeVLLM

TASK = "reasoning_gym:chain_sum"


@pytest.fixture(scope="module")
def fake_url() -> Iterator[str]:
    # the engine's GET /weight_info names the weights serving: every record must carry it
    with serve_in_thread(FakeVLLM(tool_call_every_turn=True, weight_version="step-2").app) as url:
        yield url + "/v1"


@pytest.fixture(scope="module")
def collection(fake_url, tmp_path_factory) -> Path:
    """A token-tier collection of 12 chain_sum episodes (6 instances x 2) made on the fake."""
    out = tmp_path_factory.mktemp("c") / "chain"
    config = CollectConfig(
        tasks=[TASK],
        episodes=12,
        group_size=2,
        llm=LLMSpec(url=fake_url),
        limits=Limits(max_turns=2),
        task_config={"min_terms": 2, "max_terms": 3},
    )

    run_collection(config, out)
    return out


def run_collection(config: CollectConfig, out: Path) -> None:
    async def run() -> None:
        pool = EndpointPool()
        try:
            await collect(config, out, pool=pool)
        finally:
            await pool.aclose()

    anyio.run(run)


def episodes(path: Path) -> list[dict]:
    return [json.loads(x) for x in (path / "episodes.jsonl").read_text().splitlines()]


def load(out: Path, cache: Path) -> datasets.DatasetDict:
    return datasets.load_dataset(str(out), cache_dir=str(cache))


def test_token_tier_rows_carry_the_captured_ids_and_loss_mask_verbatim(collection, tmp_path):
    result = export_sft(collection, tmp_path / "sft", eval_fraction=0.0)
    assert result.token_columns and result.rows == {"train": 12, "eval": 0}
    loaded = load(tmp_path / "sft", tmp_path / "hf")
    assert list(loaded) == ["train"]  # an empty split is not written
    by_id = {e["episode_id"]: e for e in episodes(collection)}
    assert {r["episode_id"] for r in loaded["train"]} == set(by_id)
    for row in loaded["train"]:
        (seq,) = [s for s in by_id[row["episode_id"]]["sequences"] if s["role"] == "agent"]
        assert row["input_ids"] == seq["input_ids"]
        assert row["assistant_masks"] == seq["loss_mask"]
        assert sum(row["assistant_masks"]) > 0


def test_every_export_format_names_the_weights_that_sampled_it(collection, tmp_path):
    """The engine's weight version, captured per turn, reaches the episode records, both rows
    and sequences of the Parquet and JSONL export, and the SFT rows."""
    assert {tuple(e["weight_versions"]) for e in episodes(collection)} == {("step-2",)}
    export_collection(collection, tmp_path / "flat")
    for kind, files in (("parquet", "train-*.parquet"), ("json", "train.jsonl")):
        rows = datasets.load_dataset(
            kind,
            data_files=str(tmp_path / "flat" / files),
            split="train",
            cache_dir=str(tmp_path / "hf"),
        )
        assert rows.num_rows == 12 and set(map(tuple, rows["weight_versions"])) == {("step-2",)}
        for row in rows:
            agent = [s for s in row["sequences"] if s["role"] == "agent"]
            assert agent and all(set(s["weight_versions"]) == {"step-2"} for s in agent)
    export_sft(collection, tmp_path / "sft", eval_fraction=0.0)
    sft = load(tmp_path / "sft", tmp_path / "hf-sft")["train"]
    assert set(map(tuple, sft["weight_versions"])) == {("step-2",)}


def test_messages_are_conversational_with_tool_calls_as_objects_and_tools(collection, tmp_path):
    export_sft(collection, tmp_path / "sft", eval_fraction=0.0)
    row = load(tmp_path / "sft", tmp_path / "hf")["train"][0]
    assert [m["role"] for m in row["messages"]] == ["user", "assistant", "tool"]
    call = row["messages"][1]["tool_calls"][0]["function"]
    assert call["name"] == "answer" and isinstance(call["arguments"], dict)
    assert "answer" in call["arguments"]
    assert row["messages"][2]["tool_call_id"] == row["messages"][1]["tool_calls"][0]["id"]
    assert [t["function"]["name"] for t in row["tools"]] == ["answer"]
    assert set(row["tools"][0]["function"]["parameters"]["properties"]) == {"answer"}


def test_messages_only_drops_the_token_columns(collection, tmp_path):
    result = export_sft(collection, tmp_path / "sft", messages_only=True, eval_fraction=0.0)
    assert not result.token_columns
    train = load(tmp_path / "sft", tmp_path / "hf")["train"]
    assert "input_ids" not in train.column_names and "assistant_masks" not in train.column_names
    assert train.num_rows == 12


def test_the_split_is_by_task_instance_and_recorded(collection, tmp_path):
    result = export_sft(collection, tmp_path / "sft", eval_fraction=0.5)
    loaded = load(tmp_path / "sft", tmp_path / "hf")
    assert result.rows["train"] + result.rows["eval"] == 12 and result.rows["eval"] > 0
    seeds = {s: {r["seed"] for r in loaded[s]} for s in ("train", "eval")}
    assert not seeds["train"] & seeds["eval"]  # no instance in both splits
    for split in ("train", "eval"):
        for row in loaded[split]:
            assert split_of(row["task"], row["seed"], 0.5) == split
        # both samples of an instance (a group of 2) are in the same split
        assert all(sum(r["seed"] == s for r in loaded[split]) == 2 for s in seeds[split])
    recorded = json.loads((tmp_path / "sft" / "split.json").read_text())
    assert recorded["eval_fraction"] == 0.5 and "sha256" in recorded["rule"]
    for split in ("train", "eval"):
        assert recorded[split]["rows"] == result.rows[split]
        assert {s for _, s in recorded[split]["instances"]} == seeds[split]


def test_split_of_is_stable_and_roughly_the_fraction():
    picks = [split_of(TASK, seed, 0.2) for seed in range(2000)]
    assert picks == [split_of(TASK, seed, 0.2) for seed in range(2000)]
    assert 0.17 < picks.count("eval") / len(picks) < 0.23
    assert all(split_of(TASK, s, 0.0) == "train" for s in range(100))


def _store(path: Path, records) -> Path:
    with EpisodeStore(path, config={"c": 1}) as store:
        for r in records:
            store.write_episode(r)
    return path


CONVERSATION = [
    {"role": "user", "content": "2+2?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "answer", "arguments": '{"answer": "4"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "ok"},
]


def test_min_reward_keeps_exactly_the_episodes_at_or_above_it(tmp_path):
    rewards = [1.0, 0.0, None, 0.5, 1.0, 0.49]
    records = [
        make_record(i, seed=i, reward=r, messages=CONVERSATION) for i, r in enumerate(rewards)
    ]
    src = _store(tmp_path / "c", records)
    result = export_sft(src, tmp_path / "sft", min_reward=0.5, eval_fraction=0.0)
    assert result.rows["train"] == 3 and result.skipped["below_min_reward"] == 3
    kept = load(tmp_path / "sft", tmp_path / "hf")["train"]
    assert sorted(kept["reward"]) == [0.5, 1.0, 1.0]


def test_an_episode_with_several_training_sequences_is_skipped_and_counted(tmp_path):
    fragmented = make_record(0, seed=0, messages=CONVERSATION)
    second = fragmented.sequences[1].model_copy(update={"sequence_id": "n3"})
    fragmented = fragmented.model_copy(update={"sequences": [*fragmented.sequences, second]})
    whole = make_record(1, seed=1, messages=CONVERSATION)
    result = export_sft(
        _store(tmp_path / "c", [fragmented, whole]), tmp_path / "sft", eval_fraction=0.0
    )
    assert result.rows["train"] == 1 and result.skipped["fragmented"] == 1


def test_eval_tier_episodes_export_messages_only(tmp_path):
    from rollwire.capture.rollout import CaptureLevel, RolloutType

    text = [
        make_record(i, seed=i, messages=CONVERSATION, sequences=[]).model_copy(
            update={"rollout_type": RolloutType.EVAL, "capture_level": CaptureLevel.TEXT}
        )
        for i in range(3)
    ]
    no_talk = make_record(9, seed=9).model_copy(
        update={"rollout_type": RolloutType.EVAL, "sequences": []}
    )
    result = export_sft(
        _store(tmp_path / "c", [*text, no_talk]), tmp_path / "sft", eval_fraction=0.0
    )
    assert not result.token_columns and result.rows["train"] == 3
    assert result.skipped["no_conversation"] == 1


def test_nothing_to_export_is_an_error_naming_why(tmp_path):
    src = _store(tmp_path / "c", [make_record(0, reward=0.0, messages=CONVERSATION)])
    with pytest.raises(ExportError, match=r"1 below min_reward 1\.0"):
        export_sft(src, tmp_path / "sft", min_reward=1.0)


def test_sft_messages_parse_json_arguments_and_keep_the_rest():
    out = sft_messages(CONVERSATION)
    assert out[1]["tool_calls"][0]["function"]["arguments"] == {"answer": "4"}
    assert out[0] == CONVERSATION[0] and out[2] == CONVERSATION[2]
    assert CONVERSATION[1]["tool_calls"][0]["function"]["arguments"] == '{"answer": "4"}'
    odd = [
        {"role": "assistant", "tool_calls": [{"function": {"name": "x", "arguments": "not json"}}]}
    ]
    assert sft_messages(odd)[0]["tool_calls"][0]["function"]["arguments"] == '"not json"'


def test_cli_export_sft_prints_rows_and_writes_the_dataset(collection, tmp_path, capsys):
    out = tmp_path / "sft"
    argv = ["export", str(collection), "--format", "sft", "--out", str(out)]
    assert cli.main([*argv, "--eval-fraction", "0.5", "--min-reward", "0"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("sft: train ") and "input_ids, assistant_masks" in printed
    assert (out / "split.json").exists() and (out / "README.md").exists()
    assert cli.main(["export", str(collection), "--min-reward", "1"]) == 2
    assert "apply to --format sft" in capsys.readouterr().err
    assert cli.main([*argv, "--eval-fraction", "1.5"]) == 2
    assert "eval_fraction" in capsys.readouterr().err


@pytest.mark.slow
def test_sft_trainer_trains_on_the_token_tier_export_as_is(collection, tmp_path):
    """TRL's own preparation of the exported ids: labels are the captured ids where the
    capture's loss mask is 1 and -100 elsewhere, and one optimizer step runs."""
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from tests.fakes.tiny_model import tiny_model

    export_sft(collection, tmp_path / "sft", eval_fraction=0.0)
    train = load(tmp_path / "sft", tmp_path / "hf")["train"]
    model_dir = tiny_model(tmp_path / "tiny")
    trainer = SFTTrainer(
        model=str(model_dir),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        train_dataset=train,
        args=SFTConfig(
            output_dir=str(tmp_path / "run"),
            max_steps=1,
            per_device_train_batch_size=4,
            report_to="none",
            save_strategy="no",
            logging_steps=1,
            max_length=None,
            bf16=False,
        ),
    )
    prepared = trainer.train_dataset
    by_id = {e["episode_id"]: e for e in episodes(collection)}
    for row, original in zip(prepared, train, strict=True):
        (seq,) = [s for s in by_id[original["episode_id"]]["sequences"] if s["role"] == "agent"]
        assert row["input_ids"] == seq["input_ids"]
        expected = [
            t if m else -100 for t, m in zip(seq["input_ids"], seq["loss_mask"], strict=True)
        ]
        assert row["labels"] == expected
    trainer.train()
    (log,) = [e for e in trainer.state.log_history if "loss" in e]
    assert trainer.state.global_step == 1 and log["loss"] > 0


@pytest.mark.slow
def test_exported_messages_render_through_the_student_template_as_the_engine_saw_them(
    collection, tmp_path, hf_tokenizer, reference_model
):
    """The exported conversation (tool-call arguments as objects, tool results, tools), rendered
    by the chat template ``rollwire convert`` gives the student, is the very text the reference
    engine renders for the conversation as the agent held it."""
    export_sft(collection, tmp_path / "sft", eval_fraction=0.0, messages_only=True)
    rows = load(tmp_path / "sft", tmp_path / "hf")["train"]
    originals = {e["episode_id"]: e for e in episodes(collection)}
    for row in rows:
        original = originals[row["episode_id"]]
        ours = hf_tokenizer.apply_chat_template(row["messages"], tools=row["tools"], tokenize=False)
        engine = reference_model.render(
            original["messages"], original["tools"], add_generation_prompt=False
        )
        assert ours == engine


@pytest.fixture(scope="module")
def engine_collection(engine_url, tmp_path_factory) -> Path:
    """Token-tier episodes from the real reference engine, greedy, answers in text."""
    from tests.conftest import SERVED

    out = tmp_path_factory.mktemp("engine") / "c"
    config = CollectConfig(
        tasks=[TASK, "textarena:TowerOfHanoi-v0"],
        episodes=4,
        llm=LLMSpec(url=f"{engine_url}/v1", model=SERVED),
        limits=Limits(max_turns=3),
        sampling=Sampling(temperature=0.0, max_tokens=40),
        answer_mode="text",
    )

    run_collection(config, out)
    return out


@pytest.mark.slow
def test_the_engines_ids_round_trip_through_the_exported_messages(
    engine_collection, tmp_path, hf_tokenizer
):
    """On a real engine the exported messages tokenise, through the student's template, to the
    captured ids, and the template's assistant mask is the capture's loss mask (multi-turn
    TextArena included): the two columns describe one training sequence."""
    result = export_sft(engine_collection, tmp_path / "sft", eval_fraction=0.0)
    assert result.token_columns and result.rows["train"] == 4
    rows = load(tmp_path / "sft", tmp_path / "hf")["train"]
    assert max(sum(m["role"] == "assistant" for m in r["messages"]) for r in rows) > 1
    eos = hf_tokenizer.convert_tokens_to_ids("<|im_end|>")
    for row in rows:
        rendered = hf_tokenizer.apply_chat_template(
            row["messages"], tools=row["tools"], tokenize=True, return_dict=True,
            return_assistant_tokens_mask=True,
        )  # fmt: skip
        n = len(row["input_ids"])
        assert rendered["input_ids"][:n] == row["input_ids"]
        template_mask = list(rendered["assistant_masks"][:n])
        # Every token the capture trains is an assistant token of the template; they differ only
        # on an <|im_end|> that closes a turn cut off by max_tokens: the template counts it as
        # the assistant's, but the engine never sampled it (it is prompt glue in the capture).
        differ = [i for i in range(n) if template_mask[i] != row["assistant_masks"][i]]
        assert all(template_mask[i] == 1 and row["input_ids"][i] == eos for i in differ)
        assert all(row["input_ids"][i + 1 : i + 3] == [198, 1] for i in differ)  # "\n" + next turn
        # after the capture: the newline after the last EOS, or the EOS itself when the last
        # turn was cut off by max_tokens (the capture holds only what was sampled)
        assert hf_tokenizer.decode(rendered["input_ids"][n:]) in ("\n", "<|im_end|>\n")
