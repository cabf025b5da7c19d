"""A local stand-in for the Hugging Face Hub: serves model repositories the way huggingface.co does for
huggingface_hub (model info with file metadata, HEAD and ranged GET on resolve URLs), records what it was
asked, and can drop a connection half-way through a file."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, unquote, urlsplit

from tests.support.fake_server import LocalServer

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin")


class FakeHub(LocalServer):
    """Serve `repos` ({repo_id: {filename: bytes}}) on 127.0.0.1 at a random port; use as a context manager."""

    def __init__(self, repos: dict[str, dict[str, bytes]]):
        self.repos = repos
        self.commits = {repo: hashlib.sha1(repo.encode()).hexdigest() for repo in repos}
        self.requests: list[tuple[str, str, str]] = []  # (method, path, Range header or "")
        self.drops: set[str] = set()  # filenames whose next GET sends half the bytes, then closes
        self.pause_s = 0.0  # a pause after every 64 KB sent: a slow network, to cancel a download part-way
        self.downloads: dict[str, int] = {}  # a repository's downloads, for the listing's order
        self.tags: dict[str, list[str]] = {}  # a repository's tags ("gguf", ...)
        self._lock = threading.Lock()
        super().__init__(_handler(self))

    def drop_once(self, filename: str) -> None:
        self.drops.add(filename)

    def ranges(self, filename: str) -> list[int]:
        """Where each ranged GET of `filename` started."""
        return [int(re.match(r"bytes=(\d+)-", r).group(1)) for m, p, r in self.requests
                if m == "GET" and p.endswith("/" + filename) and r]

    def siblings(self, repo: str) -> list[dict]:
        out = []
        for name, data in sorted(self.repos[repo].items()):
            sibling = {"rfilename": name, "size": len(data), "blobId": _git_oid(data)}
            if name.endswith(LFS_SUFFIXES):
                sibling["lfs"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "pointerSize": 134}
            out.append(sibling)
        return out


def _git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def do_GET(self) -> None:
            self._serve(body=True)

        def _serve(self, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            with hub._lock:
                hub.requests.append((self.command, path, self.headers.get("Range") or ""))
            if path == "/api/models":
                return self._listing(parse_qs(urlsplit(self.path).query), body)
            api = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
            if api:
                return self._api(api.group(1), body)
            resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
            if resolve:
                return self._file(resolve.group(1), resolve.group(3), body)
            self._reply(404, b"not found", {"X-Error-Code": "EntryNotFound"}, body)

        def _listing(self, query: dict, body: bool) -> None:
            """GET /api/models: the repositories whose id holds `search`, with the `filter` tags, most
            downloaded first, at most `limit` (as huggingface.co answers it, one page)."""
            text = (query.get("search") or [""])[0].lower()
            wanted = set(query.get("filter") or [])
            found = [r for r in hub.repos if text in r.lower() and wanted <= set(hub.tags.get(r, []))]
            found.sort(key=lambda r: -hub.downloads.get(r, 0))
            limit = int((query.get("limit") or ["1000"])[0])
            rows = [{"id": r, "modelId": r, "downloads": hub.downloads.get(r, 0), "likes": 0, "tags": hub.tags.get(r, []),
                     "pipeline_tag": "text-generation", "library_name": "gguf" if "gguf" in hub.tags.get(r, []) else
                     "transformers"} for r in found[:limit]]
            self._reply(200, json.dumps(rows).encode(), {"Content-Type": "application/json"}, body)

        def _api(self, repo: str, body: bool) -> None:
            if repo not in hub.repos:
                return self._reply(404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"}, body)
            info = {"id": repo, "modelId": repo, "sha": hub.commits[repo], "private": False,
                    "siblings": hub.siblings(repo)}
            self._reply(200, json.dumps(info).encode(), {"Content-Type": "application/json"}, body)

        def _file(self, repo: str, name: str, body: bool) -> None:
            if repo not in hub.repos:
                return self._reply(404, b"Repository not found", {"X-Error-Code": "RepoNotFound"}, body)
            data = hub.repos[repo].get(name)
            if data is None:
                return self._reply(404, b"Entry not found", {"X-Error-Code": "EntryNotFound",
                                                            "X-Repo-Commit": hub.commits[repo]}, body)
            headers = {"X-Repo-Commit": hub.commits[repo], "Accept-Ranges": "bytes", "ETag": f'"{_git_oid(data)}"',
                       "Content-Type": "application/octet-stream"}
            if name.endswith(LFS_SUFFIXES):
                headers.update({"X-Linked-Etag": f'"{hashlib.sha256(data).hexdigest()}"',
                                "X-Linked-Size": str(len(data))})
            start = 0
            wanted = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
            status = 200
            if wanted and body:
                start = int(wanted.group(1))
                if start >= len(data):
                    return self._reply(416, b"", {"Content-Range": f"bytes */{len(data)}"}, body)
                status = 206
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            if body and name in hub.drops:
                hub.drops.discard(name)
                headers["Content-Length"] = str(len(data) - start)
                self._head(status, headers)
                self.wfile.write(data[start:start + (len(data) - start) // 2])
                self.wfile.flush()
                self.close_connection = True
                return
            self._reply(status, data[start:], headers, body)

        def _head(self, status: int, headers: dict) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()

        def _reply(self, status: int, data: bytes, headers: dict, body: bool) -> None:
            self._head(status, {**headers, "Content-Length": str(len(data))})
            if body and not hub.pause_s:
                self.wfile.write(data)
            elif body:
                try:
                    for at in range(0, len(data), 1 << 16):
                        self.wfile.write(data[at : at + (1 << 16)])
                        self.wfile.flush()
                        time.sleep(hub.pause_s)
                except (BrokenPipeError, ConnectionResetError):  # the client cancelled: as the Hub, carry on
                    self.close_connection = True

    return Handler
