"""A stand-in for the Hugging Face Hub: only the routes ``HfApi.create_repo`` and
``HfApi.create_commit`` call, with every request recorded.

- ``POST /api/repos/create``: creates a repo (409 if it exists).
- ``POST /api/validate-yaml``: accepts any card (create_commit checks README.md first).
- ``POST /api/{type}s/{ns}/{name}/preupload/{rev}``: answers ``regular`` for every file, so the
  client sends contents inline (base64) in the commit and no LFS/Xet upload happens.
- ``POST /api/{type}s/{ns}/{name}/commit/{rev}``: reads the NDJSON commit and keeps the files.

Any other route is recorded and answered 404. Requests without ``Bearer <token>`` get 401.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Repo:
    repo_type: str
    private: bool
    files: dict[str, bytes] = field(default_factory=dict)
    commits: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class FakeHub:
    token: str
    repos: dict[str, Repo] = field(default_factory=dict)
    requests: list[Recorded] = field(default_factory=list)
    commit_status: int | None = None  # answer commits with this error status instead

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/api/repos/create", self._create, methods=["POST"]),
                Route("/api/validate-yaml", self._validate_yaml, methods=["POST"]),
                Route(
                    "/api/{kind}s/{ns}/{name}/preupload/{rev}", self._preupload, methods=["POST"]
                ),
                Route("/api/{kind}s/{ns}/{name}/commit/{rev}", self._commit, methods=["POST"]),
                Route("/{rest:path}", self._other, methods=["GET", "POST", "PUT", "HEAD"]),
            ]
        )

    async def _record(self, request: Request) -> JSONResponse | None:
        body = await request.body()
        self.requests.append(
            Recorded(request.method, request.url.path, dict(request.headers), body)
        )
        if request.headers.get("authorization") != f"Bearer {self.token}":
            return JSONResponse(
                {"error": "Invalid credentials in Authorization header"},
                status_code=401,
                headers={"X-Error-Message": "Invalid credentials in Authorization header"},
            )
        return None

    async def _create(self, request: Request) -> JSONResponse:
        if (denied := await self._record(request)) is not None:
            return denied
        payload = await request.json()
        repo_id = f"{payload['organization']}/{payload['name']}"
        base = str(request.base_url).rstrip("/")
        url = f"{base}/datasets/{repo_id}"
        if repo_id in self.repos:
            return JSONResponse({"error": "You already created this dataset repo", "url": url}, 409)
        private = payload.get("visibility") == "private" or payload.get("private") is True
        self.repos[repo_id] = Repo(repo_type=payload.get("type", "model"), private=private)
        return JSONResponse({"url": url, "name": repo_id})

    async def _validate_yaml(self, request: Request) -> JSONResponse:
        if (denied := await self._record(request)) is not None:
            return denied
        return JSONResponse({"errors": [], "warnings": []})

    async def _preupload(self, request: Request) -> JSONResponse:
        if (denied := await self._record(request)) is not None:
            return denied
        files = (await request.json())["files"]
        return JSONResponse(
            {
                "files": [
                    {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                    for f in files
                ]
            }
        )

    async def _commit(self, request: Request) -> JSONResponse:
        if (denied := await self._record(request)) is not None:
            return denied
        p = request.path_params
        repo_id = f"{p['ns']}/{p['name']}"
        if self.commit_status is not None:
            message = "A commit has happened since. Please refresh and try again."
            return JSONResponse(
                {"error": message}, self.commit_status, headers={"X-Error-Message": message}
            )
        repo = self.repos.get(repo_id)
        if repo is None:
            return JSONResponse({"error": "Repository not found"}, 404)
        lines = [json.loads(line) for line in (await request.body()).splitlines() if line]
        header = next(item["value"] for item in lines if item["key"] == "header")
        for item in lines:
            if item["key"] == "file":
                value = item["value"]
                assert value["encoding"] == "base64"
                repo.files[value["path"]] = base64.b64decode(value["content"])
            elif item["key"] != "header":
                return JSONResponse({"error": f"stand-in cannot take {item['key']}"}, 400)
        oid = hashlib.sha1(await request.body()).hexdigest()
        repo.commits.append({"summary": header["summary"], "oid": oid})
        base = str(request.base_url).rstrip("/")
        return JSONResponse(
            {
                "commitUrl": f"{base}/datasets/{repo_id}/commit/{oid}",
                "commitOid": oid,
                "success": True,
            }
        )

    async def _other(self, request: Request) -> JSONResponse:
        if (denied := await self._record(request)) is not None:
            return denied
        return JSONResponse({"error": "not in the stand-in"}, 404)
