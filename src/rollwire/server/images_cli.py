"""``rollwire images``: the Docker base images this machine can make, and what the daemon has."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rollwire.server import options


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _client(args: argparse.Namespace) -> Any:
    from rollwire.harnesses.harbor.docker import docker_client, docker_problem

    problem = docker_problem(args.docker_host)
    if problem is not None:
        raise SystemExit(f"rollwire images: {problem}")
    return docker_client(args.docker_host)


def _cmd_build(args: argparse.Namespace) -> int:
    """make base images here (debian:bookworm-slim, ...)"""
    from rollwire.harnesses.harbor.images import BASES, ImageError, build_base

    unknown = [ref for ref in args.refs if ref not in BASES]
    for ref in unknown:
        _say(f"rollwire images build: {ref}: not buildable here; known: {', '.join(BASES)}")
    if unknown:
        return 2
    client = _client(args)
    status = 0
    for ref in args.refs:
        if not args.force:
            try:
                image = client.images.get(ref)
            except Exception:  # docker.errors.ImageNotFound: build it
                image = None
            if image is not None:
                _say(f"{ref}: already in the daemon ({image.short_id}); --force to rebuild")
                continue
        try:
            image_id = build_base(ref, client, mirror=args.mirror, say=_say)
        except ImageError as exc:
            _say(f"rollwire images build: {exc}")
            status = 1
            continue
        _say(f"{ref}: built {image_id[:19]}")
    return status


def _cmd_list(args: argparse.Namespace) -> int:
    """the daemon's images, and which ones build here"""
    from rollwire.harnesses.harbor.images import BASES

    client = _client(args)
    rows = []
    for image in client.images.list():
        for tag in image.tags or ["<none>"]:
            rows.append({"ref": tag, "id": image.short_id, "buildable_here": tag in BASES})
    if args.json:
        print(json.dumps({"images": rows, "buildable": sorted(BASES)}, indent=2))
        return 0
    for row in sorted(rows, key=lambda r: r["ref"]):
        print(f"{row['ref']:48} {row['id']}")
    print(f"buildable here (rollwire images build REF): {', '.join(sorted(BASES))}")
    return 0


def add_commands(sub: Any) -> None:
    """Docker base images for the docker sandbox: build Debian's here, list the daemon's

    The docker sandbox builds each task's Dockerfile but pulls nothing: every FROM image must be
    in the daemon. `build` makes Debian images from the Debian mirror apt uses (debootstrap +
    import; needs root and debootstrap); any other image comes from `docker load -i image.tar`
    or a registry the daemon reaches.
    """
    o = options
    verbs = o.verbs(sub, "images", add_commands, o.DOCKER_HOST)
    o.command(verbs, "build", _cmd_build, o.IMAGE_REFS, o.MIRROR, o.FORCE_BUILD)
    o.command(verbs, "list", _cmd_list, o.JSON)
