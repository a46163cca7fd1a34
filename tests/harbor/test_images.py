"""What ``rollwire images build`` can make here, and what it says about the rest."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rollwire.harnesses.harbor import images
from rollwire.harnesses.harbor.images import (
    BASES,
    ImageError,
    apt_mirror,
    build_base,
    how_to_provide,
)


def test_debian_slim_images_are_buildable_here():
    assert BASES["debian:bookworm-slim"].suite == "bookworm"
    assert BASES["debian:12-slim"].variant == "minbase"


def test_an_image_that_cannot_be_made_here_is_refused_with_docker_load(tmp_path):
    with pytest.raises(ImageError, match=r"docker load -i") as info:
        build_base("python:3.12-slim", client=None, workdir=tmp_path)
    assert "python:3.12-slim" in str(info.value)


def test_a_debian_image_names_the_build_command():
    assert "rollwire images build debian:trixie-slim" in how_to_provide("debian:trixie-slim")


def test_the_mirror_is_the_one_apt_uses(tmp_path, monkeypatch):
    sources = tmp_path / "debian.sources"
    sources.write_text(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n\n"
        "Types: deb\nURIs: http://mirror.example/debian-security\n"
    )
    monkeypatch.setattr(images, "_SOURCES", (str(sources),))
    assert apt_mirror() == "http://mirror.example/debian"


def test_without_apt_sources_the_mirror_is_debians(monkeypatch, tmp_path):
    monkeypatch.setattr(images, "_SOURCES", (str(tmp_path / "none"),))
    assert apt_mirror() == images.DEBIAN_MIRROR


def test_the_cli_refuses_an_unbuildable_ref_naming_the_known_ones(tmp_path: Path):
    done = subprocess.run(
        [sys.executable, "-m", "rollwire", "images", "build", "alpine:3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "alpine:3: not buildable here" in done.stderr and "debian:bookworm-slim" in done.stderr
