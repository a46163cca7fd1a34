"""``rollwire convert`` and ``rollwire engine --model`` refuse bad paths by name, before loading."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollwire.engine.convert import ConvertError, check_paths
from rollwire.engine.model import default_model_path, load_model
from rollwire.server.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


def test_convert_names_a_missing_gguf(tmp_path, capsys):
    missing = tmp_path / "nope.gguf"
    code, err = run(capsys, "convert", "--out", str(tmp_path / "out"), "--gguf", str(missing))
    assert code == 2 and f"{missing}: no such GGUF file" in err
    assert not (tmp_path / "out").exists()


def test_convert_refuses_a_file_that_is_not_gguf(tmp_path, capsys):
    other = tmp_path / "model.bin"
    other.write_bytes(b"x")
    code, err = run(capsys, "convert", "--out", str(tmp_path / "out"), "--gguf", str(other))
    assert code == 2 and f"{other} is not a .gguf file" in err


def test_convert_refuses_a_non_empty_folder_without_force(tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("mine")
    code, err = run(capsys, "convert", "--out", str(tmp_path))
    assert code == 2 and f"{tmp_path} is not empty" in err and "--force" in err
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_convert_refuses_an_out_path_that_is_a_file(tmp_path, capsys):
    target = tmp_path / "out"
    target.write_text("")
    code, err = run(capsys, "convert", "--out", str(target))
    assert code == 2 and f"{target} exists and is not a folder" in err


def test_force_accepts_a_non_empty_folder_and_the_default_is_the_embedded_gguf(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(ConvertError):
        check_paths(tmp_path, None, force=False)
    assert check_paths(tmp_path, None, force=True) == (default_model_path(), tmp_path)
    assert check_paths(tmp_path / "new", None, force=False)[1] == tmp_path / "new"


@pytest.mark.parametrize("flag", ["--model", "--model-path"])
def test_engine_names_a_missing_model_path(tmp_path, capsys, flag):
    missing = tmp_path / "gone"
    code, err = run(capsys, "engine", flag, str(missing), "--port", "0")
    assert code == 2 and f"{missing}: no such file or folder" in err


def test_engine_refuses_a_folder_without_config_json(tmp_path, capsys):
    code, err = run(capsys, "engine", "--model", str(tmp_path), "--port", "0")
    assert code == 2 and f"{tmp_path} is a folder without config.json" in err


def test_engine_refuses_a_file_that_is_neither(tmp_path):
    other = tmp_path / "weights.safetensors"
    other.write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match=r"neither a \.gguf file nor a Hugging Face folder"):
        load_model(other)


def test_engine_help_documents_model_and_convert(capsys):
    with pytest.raises(SystemExit):
        main(["engine", "--help"])
    out = capsys.readouterr().out
    assert "--model PATH, --model-path PATH" in out and "Hugging Face folder" in out
    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    assert "--force" in capsys.readouterr().out


def test_a_gguf_path_loads_the_llama_cpp_backend():
    model = load_model(Path(default_model_path()), n_ctx=256)
    assert model.backend == "llama.cpp" and model.path == default_model_path()
