"""A stand-in for the Hugging Face Hub on 127.0.0.1: just enough of its HTTP API for the real
`huggingface_hub` client to create a repo, commit files (regular uploads, no LFS) and
download them again (repo info, tree, resolve). Every request is recorded for the tests.

Endpoints, as huggingface_hub calls them:
  POST /api/repos/create                           create_repo (409 when it exists)
  GET  /api/models/{repo}/revision/{rev}           model_info / repo_info (siblings with blobId)
  POST /api/validate-yaml                          upload_folder checks the README front matter
  POST /api/models/{repo}/branch/{branch}          create_branch (from main)
  POST /api/models/{repo}/preupload/{rev}          upload modes: always "regular"
  POST /api/models/{repo}/commit/{rev}             ndjson: header + base64 files
  GET  /api/models/{repo}/tree/{rev}               snapshot_download's file list
  HEAD|GET /{repo}/resolve/{rev}/{path}            hf_hub_download
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

GITATTRIBUTES = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"


def blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    private: bool
    branches: dict = field(default_factory=dict)  # branch -> commit sha
    commits: dict = field(default_factory=dict)  # commit sha -> {path: bytes}

    def commit(self, branch: str, files: dict, message: str) -> str:
        sha = hashlib.sha1(f"{branch}:{message}:{len(self.commits)}".encode()).hexdigest()
        self.commits[sha] = files
        self.branches[branch] = sha
        return sha

    def files_at(self, rev: str) -> tuple[str, dict] | None:
        sha = self.branches.get(rev, rev)
        return (sha, self.commits[sha]) if sha in self.commits else None


@dataclass
class Request:
    method: str
    path: str
    query: dict
    headers: dict  # lower-case names
    body: bytes


class StandInHub:
    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.requests: list[Request] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # httpx keeps connections alive; every reply has a length

            def log_message(self, *args):
                pass

            def _handle(self):
                url = urlparse(self.path)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                hub.requests.append(Request(self.command, unquote(url.path), parse_qs(url.query),
                                            {k.lower(): v for k, v in self.headers.items()}, body))
                status, headers, payload = hub.route(self.command, unquote(url.path), body)
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                if "Content-Type" not in headers:
                    self.send_header("Content-Type", "application/json")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_POST = do_HEAD = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def calls(self, method: str, pattern: str) -> list[Request]:
        return [r for r in self.requests if r.method == method and re.fullmatch(pattern, r.path)]

    # ------------------------------------------------------------------ routes
    def route(self, method: str, path: str, body: bytes):
        if method == "POST" and path == "/api/repos/create":
            req = json.loads(body)
            repo_id = f"{req['organization']}/{req['name']}"
            if repo_id in self.repos:
                return 409, {}, {"error": "You already created this model repo", "url": f"{self.url}/{repo_id}"}
            self.repos[repo_id] = Repo(private=req.get("visibility") == "private")
            self.repos[repo_id].commit("main", {".gitattributes": GITATTRIBUTES}, "initial commit")
            return 200, {}, {"url": f"{self.url}/{repo_id}"}
        if method == "POST" and path == "/api/validate-yaml":
            return 200, {}, {"errors": [], "warnings": []}
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/(revision|preupload|commit|tree|branch)/([^/]+)", path)
        if m:
            return self._repo_api(method, m.group(2), m.group(1), m.group(3), body)
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m and method in ("HEAD", "GET"):
            return self._resolve(m.group(1), m.group(2), m.group(3))
        return 404, {}, {"error": f"stand-in hub: no route for {method} {path}"}

    def _lookup(self, repo_id: str, rev: str):
        if repo_id not in self.repos:
            return None, (404, {"X-Error-Code": "RepoNotFound"}, {"error": "Repository not found"})
        found = self.repos[repo_id].files_at(rev)
        if found is None:
            return None, (404, {"X-Error-Code": "RevisionNotFound"}, {"error": f"Invalid rev id: {rev}"})
        return found, None

    def _repo_api(self, method: str, what: str, repo_id: str, rev: str, body: bytes):
        if what == "commit" and method == "POST":
            if repo_id not in self.repos:
                return 404, {"X-Error-Code": "RepoNotFound"}, {"error": "Repository not found"}
            repo = self.repos[repo_id]
            files = dict(repo.files_at(rev)[1]) if repo.files_at(rev) else {}
            message = ""
            for line in body.decode().splitlines():
                item = json.loads(line)
                if item["key"] == "header":
                    message = item["value"]["summary"]
                elif item["key"] == "file":
                    files[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
                else:  # lfsFile / deletedFile: not needed by these tests, so refuse loudly
                    return 400, {}, {"error": f"stand-in hub: unsupported commit operation {item['key']}"}
            sha = repo.commit(rev, files, message)
            return 200, {}, {"commitUrl": f"{self.url}/{repo_id}/commit/{sha}", "commitOid": sha}
        if what == "branch" and method == "POST":
            repo = self.repos.get(repo_id)
            if repo is None:
                return 404, {"X-Error-Code": "RepoNotFound"}, {"error": "Repository not found"}
            if rev in repo.branches:
                return 409, {}, {"error": f"branch {rev} already exists"}
            repo.branches[rev] = repo.branches["main"]
            return 200, {}, {}
        found, error = self._lookup(repo_id, rev)
        if error:
            return error
        sha, files = found
        if what == "preupload" and method == "POST":
            return 200, {}, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False,
                                        "oid": blob_id(files[f["path"]]) if f["path"] in files else None}
                                       for f in json.loads(body)["files"]]}
        if what == "revision" and method == "GET":
            return 200, {}, {"id": repo_id, "sha": sha, "private": self.repos[repo_id].private,
                             "siblings": [{"rfilename": p, "size": len(d), "blobId": blob_id(d)}
                                          for p, d in sorted(files.items())]}
        if what == "tree" and method == "GET":
            return 200, {}, [{"type": "file", "path": p, "size": len(d), "oid": blob_id(d)}
                             for p, d in sorted(files.items())]
        return 405, {}, {"error": f"stand-in hub: {method} {what} not supported"}

    def _resolve(self, repo_id: str, rev: str, path: str):
        found, error = self._lookup(repo_id, rev)
        if error:
            return error
        sha, files = found
        if path not in files:
            return 404, {"X-Error-Code": "EntryNotFound"}, {"error": f"{path} not found"}
        data = files[path]
        return 200, {"X-Repo-Commit": sha, "ETag": f'"{blob_id(data)}"',
                     "Content-Type": "application/octet-stream"}, data
