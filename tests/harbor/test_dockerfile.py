"""A task's Dockerfile as the local sandbox carries it out: what is honoured, what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollwire.harnesses.harbor.dockerfile import (
    CopyFiles,
    MakeDir,
    UnsupportedDockerfileError,
    apply_plan,
    plan_dockerfile,
)


def context(tmp_path: Path, dockerfile: str, files: dict[str, str] | None = None) -> Path:
    ctx = tmp_path / "environment"
    ctx.mkdir(parents=True, exist_ok=True)
    (ctx / "Dockerfile").write_text(dockerfile)
    for rel, text in (files or {}).items():
        (ctx / rel).parent.mkdir(parents=True, exist_ok=True)
        (ctx / rel).write_text(text)
    return ctx


def build(tmp_path: Path, dockerfile: str, files: dict[str, str] | None = None) -> Path:
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    apply_plan(plan_dockerfile(context(tmp_path, dockerfile, files)), root, read_only=["/usr"])
    return root


def test_workdir_env_arg_and_user_are_recorded(tmp_path: Path) -> None:
    plan = plan_dockerfile(
        context(
            tmp_path,
            "# comment\nFROM python:3.12-slim AS base\nARG APP=/srv\nWORKDIR $APP\nWORKDIR app\n"
            'ENV A=1 B="two words" C=${A}-x\nENV LEGACY some value\n'
            'ENV D=${MISSING:-fallback} E=${A:+set}\nUSER nobody\nCMD ["bash"]\n',
        )
    )
    assert plan.base_image == "python:3.12-slim"
    assert plan.workdir == "/srv/app"
    assert plan.env == {
        "A": "1",
        "B": "two words",
        "C": "-x",  # as in Docker: one ENV line sees the values from before it
        "LEGACY": "some value",
        "D": "fallback",
        "E": "set",
    }
    assert plan.user == "nobody"
    assert plan.steps == (MakeDir("/srv", 4), MakeDir("/srv/app", 5))
    assert plan.ignored and plan.ignored[0].startswith("CMD (line 10)")


def test_continuation_lines_join_into_one_instruction(tmp_path: Path) -> None:
    plan = plan_dockerfile(context(tmp_path, "FROM x\nENV A=1 \\\n    # note\n    B=2\n"))
    assert plan.env == {"A": "1", "B": "2"}


def test_copy_follows_docker_rules(tmp_path: Path) -> None:
    root = build(
        tmp_path,
        "FROM x\nWORKDIR /app\nCOPY src/ ./code/\nCOPY one.txt /data/renamed.txt\n"
        "COPY one.txt two.txt /multi/\nCOPY --chmod=755 run.sh /opt/tools/run.sh\n"
        'COPY ["one.txt", "/json/"]\nCOPY *.txt /glob/\n',
        {
            "src/a.py": "a\n",
            "src/pkg/b.py": "b\n",
            "one.txt": "1\n",
            "two.txt": "2\n",
            "run.sh": "#!/bin/sh\n",
        },
    )
    assert (root / "app/code/a.py").read_text() == "a\n"
    assert (root / "app/code/pkg/b.py").read_text() == "b\n"
    assert (root / "data/renamed.txt").read_text() == "1\n"
    assert sorted(p.name for p in (root / "multi").iterdir()) == ["one.txt", "two.txt"]
    assert (root / "opt/tools/run.sh").stat().st_mode & 0o777 == 0o755
    assert (root / "json/one.txt").exists()
    assert sorted(p.name for p in (root / "glob").iterdir()) == ["one.txt", "two.txt"]


def test_dockerignore_is_respected(tmp_path: Path) -> None:
    root = build(
        tmp_path,
        "FROM x\nCOPY . /app/\n",
        {
            ".dockerignore": "*.log\nsecrets/\n!keep.log\n",
            "a.txt": "a",
            "debug.log": "x",
            "keep.log": "k",
            "secrets/key": "s",
        },
    )
    names = sorted(p.name for p in (root / "app").iterdir())
    assert names == [".dockerignore", "Dockerfile", "a.txt", "keep.log"]


def test_add_unpacks_a_local_tar_archive(tmp_path: Path) -> None:
    import tarfile

    ctx = context(tmp_path, "FROM x\nADD bundle.tar.gz /opt/bundle/\n")
    payload = tmp_path / "payload.txt"
    payload.write_text("inside\n")
    with tarfile.open(ctx / "bundle.tar.gz", "w:gz") as tar:
        tar.add(payload, arcname="dir/payload.txt")
    root = tmp_path / "root"
    root.mkdir()
    apply_plan(plan_dockerfile(ctx), root, read_only=[])
    assert (root / "opt/bundle/dir/payload.txt").read_text() == "inside\n"


@pytest.mark.parametrize("step", ["RUN true", "RUN :", 'RUN ["true"]', "RUN mkdir -p /a/b /c"])
def test_allowed_run_steps(tmp_path: Path, step: str) -> None:
    plan = plan_dockerfile(context(tmp_path, f"FROM x\n{step}\n"))
    assert all(isinstance(s, MakeDir) for s in plan.steps)


@pytest.mark.parametrize(
    ("dockerfile", "message"),
    [
        ("FROM x\nWORKDIR /app\nRUN pip install numpy\n", r"Dockerfile:3: RUN pip install numpy"),
        ("FROM x\nRUN mkdir -p /a && touch /a/b\n", r"Dockerfile:2: RUN mkdir"),
        ("FROM a AS build\nFROM b\n", "multi-stage"),
        ("FROM x\nCOPY --from=build /x /y\n", "--from needs Docker"),
        ("FROM x\nADD https://example.com/f /f\n", "needs the network"),
        ("FROM x\nCOPY ../outside /x\n", "matches nothing|outside the build context"),
        ("FROM x\nCOPY missing.txt /x\n", "matches nothing"),
        ("WORKDIR /app\n", "no FROM"),
        ("FROM x\nFROBNICATE now\n", "unknown instruction FROBNICATE"),
    ],
)
def test_unsupported_dockerfiles_are_refused_naming_why(
    tmp_path: Path, dockerfile: str, message: str
) -> None:
    (tmp_path / "outside").write_text("host data")
    with pytest.raises(UnsupportedDockerfileError, match=message):
        plan_dockerfile(context(tmp_path, dockerfile))


def test_copy_into_a_read_only_host_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedDockerfileError, match="read-only"):
        build(tmp_path, "FROM x\nCOPY a /usr/bin/a\n", {"a": "a"})


def test_copy_through_a_symlink_out_of_the_root_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "host-dir"
    outside.mkdir()
    ctx = context(tmp_path, "FROM x\nCOPY tree /app/tree\nCOPY a /app/tree/escape/a\n", {"a": "a"})
    (ctx / "tree").mkdir()
    (ctx / "tree" / "escape").symlink_to(outside)  # copied as a link, as Docker does
    root = tmp_path / "root"
    root.mkdir()
    with pytest.raises(UnsupportedDockerfileError, match="outside the sandbox root"):
        apply_plan(plan_dockerfile(ctx), root, read_only=[])
    assert (root / "app/tree/escape").is_symlink()
    assert list(outside.iterdir()) == []


def test_copy_steps_keep_their_line(tmp_path: Path) -> None:
    plan = plan_dockerfile(context(tmp_path, "FROM x\n\nCOPY a /a\n", {"a": "a"}))
    (step,) = plan.steps
    assert isinstance(step, CopyFiles) and step.line == 3 and step.dest == "/a"
