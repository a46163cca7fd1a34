"""The eval views of the web UI, over HTTP against a real ``rollwire serve --http`` whose data
directory holds three real ``rollwire eval`` folders (tests/ui/conftest.py ``evals``): which
collections are evals, one eval's report, two evals compared (the numbers ``rollwire eval
--compare`` prints), and the refusals. The page itself is in test_ui_browser.py."""

from __future__ import annotations

import shutil
from urllib.parse import urlencode

import orjson
import pytest

from rollwire.collect.evaluation import EVAL_FILE, load_report
from rollwire.datasets.evals import Comparison, EvalMismatch, compare
from rollwire.datasets.store import read_manifest
from rollwire.server.ui import NotAnEval, UnreadableEval, comparison_view, eval_view, is_eval
from tests.ui.conftest import authed

FAMILY = "harbor:examples/tasks"


def get(ui_server, path: str, **query: str):
    with authed() as client:
        return client.get(ui_server.root + path + (f"?{urlencode(query)}" if query else ""))


def family(view: dict, name: str) -> dict:
    metrics = view["report"]["metrics"]
    return next(f for f in [*metrics["families"], metrics["overall"]] if f["family"] == name)


def test_collections_list_marks_the_eval_folders_and_only_them(ui_server, evals):
    rows = {r["name"]: r for r in get(ui_server, "/ui/api/collections").json()["collections"]}
    assert {n for n, r in rows.items() if r["eval"]} == set(evals.values())
    assert rows["gsm-like"]["eval"] is False
    assert get(ui_server, f"/ui/api/collections/{evals['nop']}").json()["eval"] is True
    assert get(ui_server, "/ui/api/collections/gsm-like").json()["eval"] is False


def test_eval_view_is_its_eval_json_per_family_without_per_problem_scores(ui_server, evals):
    view = get(ui_server, f"/ui/api/evals/{evals['nop']}").json()
    report = load_report(ui_server.data_dir / evals["nop"])
    assert view["report"] == report.model_dump(mode="json", by_alias=True, exclude={"problems"})
    assert view["source"] == EVAL_FILE and view["problem_count"] == 4 == len(report.problems)
    assert view["report"]["complete"] is True and "--harness" in view["report"]["command"]
    for name, expected in (("nop", 0.0), ("oracle", 1.0)):
        view = get(ui_server, f"/ui/api/evals/{evals[name]}").json()
        assert view["report"]["metrics"]["ks"] == [1, 2]
        for fam in (FAMILY, "overall"):
            row = family(view, fam)
            assert (row["problems"], row["samples"], row["failed"]) == (4, 8, 0)
            assert (row["reward_mean"], row["reward_se"]) == (expected, 0.0)
            assert [(p["k"], p["estimate"], p["se"]) for p in row["pass_at"]] == [
                (1, expected, 0.0),
                (2, expected, 0.0),
            ]


def test_eval_view_counts_failed_attempts_by_cause(ui_server, evals):
    view = get(ui_server, f"/ui/api/evals/{evals['mixed']}").json()
    overall = family(view, "overall")
    assert (overall["problems"], overall["failed"]) == (5, 8)
    assert overall["reward_mean"] == pytest.approx(0.2) and overall["reward_se"] == pytest.approx(
        0.2
    )
    (cause, count), *rest = view["report"]["metrics"]["causes"].items()
    assert rest == [] and count == 8 and "reward_key 'correct'" in cause


def test_eval_view_refuses_a_folder_that_is_no_eval_or_lies_outside_the_data_dir(ui_server, evals):
    train = get(ui_server, "/ui/api/evals/gsm-like")
    assert train.status_code == 404 and "holds no eval" in train.json()["error"]
    assert get(ui_server, "/ui/api/evals/no-such-folder").status_code == 404
    outside = get(ui_server, "/ui/api/evals/..%2F..%2Fetc")
    assert outside.status_code in (400, 404) and "error" in outside.json()


def test_comparison_is_b_minus_a_paired_by_problem_as_rollwire_eval_compare_gives(ui_server, evals):
    got = get(ui_server, "/ui/api/compare", a=evals["nop"], b=evals["oracle"])
    assert got.status_code == 200, got.text
    view = got.json()
    a = load_report(ui_server.data_dir / evals["nop"])
    b = load_report(ui_server.data_dir / evals["oracle"])
    expected = compare(a.problems, b.problems, ks=[1, 2], names=(evals["nop"], evals["oracle"]))
    assert {k: v for k, v in view.items() if k in Comparison.model_fields} == expected.model_dump(
        mode="json"
    )
    assert view["ks"] == [1, 2] and view["pass_threshold"] == 1.0
    assert [f["family"] for f in view["families"]] == [FAMILY]
    overall = view["overall"]
    assert (overall["wins"], overall["losses"], overall["ties"]) == (4, 0, 0)
    assert [d["metric"] for d in overall["differences"]] == ["reward_mean", "pass@1", "pass@2"]
    for d in overall["differences"]:
        assert (d["diff"], d["ci_low"], d["ci_high"], d["p_value"]) == (1.0, 1.0, 1.0, 0.125)
    back = get(ui_server, "/ui/api/compare", a=evals["oracle"], b=evals["nop"]).json()
    assert {d["diff"] for d in back["overall"]["differences"]} == {-1.0}
    assert back["overall"]["losses"] == 4


def test_evals_that_do_not_pair_are_a_409_saying_what_differs(ui_server, evals):
    r = get(ui_server, "/ui/api/compare", a=evals["nop"], b=evals["mixed"])
    assert r.status_code == 409
    error = r.json()["error"]
    assert "do not pair" in error and "different tasks" in error and "sales-report" in error


def test_comparison_refuses_a_missing_name_a_non_eval_and_a_path_outside(ui_server, evals):
    missing = get(ui_server, "/ui/api/compare", a=evals["nop"])
    assert missing.status_code == 400 and missing.json()["error"].startswith("b:")
    train = get(ui_server, "/ui/api/compare", a="gsm-like", b=evals["nop"])
    assert train.status_code == 404 and "holds no eval" in train.json()["error"]
    outside = get(ui_server, "/ui/api/compare", a=evals["nop"], b="../../etc")
    assert outside.status_code == 400 and outside.json()["error"].startswith("b:")


# --- the views themselves, on copies of the folders ------------------------------------------


def test_a_collection_made_as_an_eval_without_eval_json_is_summarised_from_its_folder(
    ui_server, evals, tmp_path
):
    folder = tmp_path / "mcp-eval"
    shutil.copytree(ui_server.data_dir / evals["oracle"], folder)
    (folder / EVAL_FILE).unlink()  # as collect_episodes with eval: true leaves it
    assert is_eval(folder, read_manifest(folder))  # its manifest says purpose eval
    view = eval_view("x", folder)
    assert view["source"] == "folder"
    assert view["report"]["metrics"]["ks"] == [1] and family(view, "overall")["reward_mean"] == 1.0
    paired = comparison_view(("nop", ui_server.data_dir / evals["nop"]), ("x", folder))
    assert paired["ks"] == [1] and paired["overall"]["wins"] == 4  # the ks both report
    with pytest.raises(NotAnEval, match="holds no eval"):
        eval_view("gsm-like", ui_server.data_dir / "gsm-like")


def test_evals_passing_at_different_thresholds_do_not_pair(ui_server, evals, tmp_path):
    folder = tmp_path / "lenient"
    shutil.copytree(ui_server.data_dir / evals["oracle"], folder)
    report = orjson.loads((folder / EVAL_FILE).read_bytes())
    report["metrics"]["pass_threshold"] = 0.5
    (folder / EVAL_FILE).write_bytes(orjson.dumps(report))
    with pytest.raises(EvalMismatch, match=r"different thresholds: 1\.0 in A, 0\.5 in B"):
        comparison_view(("nop", ui_server.data_dir / evals["nop"]), ("lenient", folder))


def test_a_damaged_eval_json_is_unreadable_not_a_crash(ui_server, evals, tmp_path):
    folder = tmp_path / "damaged"
    shutil.copytree(ui_server.data_dir / evals["nop"], folder)
    (folder / EVAL_FILE).write_text('{"schema": "rollwire.eval/1"')
    with pytest.raises(UnreadableEval, match="not a rollwire eval report"):
        eval_view("damaged", folder)
