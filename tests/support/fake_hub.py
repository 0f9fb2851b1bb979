"""A Hugging Face Hub stand-in on 127.0.0.1, reached through ``HF_ENDPOINT`` by the real
``huggingface_hub`` client (the LFS path: run it with ``HF_HUB_DISABLE_XET=1``).

Written from huggingface_hub 2.4.0's own requests and the answers it parses:
``hf_api.py`` (``create_repo`` → ``POST /api/repos/create``, ``repo_info`` →
``GET /api/{type}s/{id}/revision/{rev}``, ``list_repo_tree`` → ``GET .../tree/{rev}/{path}``
paged by ``Link: rel="next"``, ``get_paths_info`` → ``POST .../paths-info/{rev}``),
``_commit_api.py`` (``_fetch_upload_modes`` → ``POST .../preupload/{rev}``, ``_send_commit``
→ the ndjson ``POST .../commit/{rev}`` with ``parentCommit``), ``lfs.py``
(``post_lfs_batch_info`` → ``POST /{id}.git/info/lfs/objects/batch``, the basic transfer's
``PUT`` and ``verify``), ``file_download.py`` (``GET``/``HEAD /{id}/resolve/{rev}/{path}``
with ``X-Repo-Commit``, ``ETag``, ``X-Linked-Etag``, ``X-Linked-Size``) and
``create_branch`` (``POST /api/{type}s/{id}/branch/{branch}`` with ``startingPoint``),
``hf_api.py``'s ``_validate_yaml`` (``POST /api/validate-yaml``, for the README HF Trainer
pushes) and ``utils/_http.py`` (``hf_raise_for_status``: ``X-Error-Code`` ``RepoNotFound``,
``RevisionNotFound``, ``EntryNotFound``; ``X-Error-Message`` for a bad token; 429 with
``RateLimit``/``RateLimit-Policy``). A commit whose ``parentCommit`` is not the branch's head
is refused with 412, as the Hub does; commits past ``commit_budget`` per ``window``, and
``/api/`` calls past ``api_budget`` per ``api_window``, get 429 with ``RateLimit`` headers.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
import secrets
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKEN = "hf_fakeTokenForTheStandIn0123456789"
READ_TOKEN = "hf_fakeReadOnlyTokenForTheStandIn01"
"""A valid token with the ``read`` role: every write is refused (403)."""
LFS_SUFFIXES = (".bin", ".safetensors", ".pt", ".pth", ".ckpt", ".h5", ".pkl", ".npy",
                ".model", ".zip", ".msgpack", ".onnx", ".distcp")
REGULAR_LIMIT = 10 * 1024**2
"""The Hub stores a file in git only below 10 MB and without an LFS suffix; else in LFS."""
PAGE = 1000


def git_oid(data: bytes) -> str:
    """A git blob's object id, as the Hub reports a file's ``oid``."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Entry:
    """One file of a commit's tree: its bytes, and its LFS sha256 when stored in LFS."""

    data: bytes
    lfs: str | None = None

    def describe(self, path: str) -> dict[str, Any]:
        body: dict[str, Any] = {"type": "file", "path": path, "size": len(self.data)}
        if self.lfs:
            pointer = (f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.lfs}\n"
                       f"size {len(self.data)}\n").encode()
            body["oid"] = git_oid(pointer)
            body["lfs"] = {"oid": self.lfs, "size": len(self.data), "pointerSize": len(pointer)}
        else:
            body["oid"] = git_oid(self.data)
        return body


@dataclass
class Commit:
    """A commit: its parent, whole tree and message."""

    sha: str
    parent: str | None
    tree: dict[str, Entry]
    message: str
    at: float


@dataclass
class Repo:
    """A repo: its commits and branches."""

    private: bool
    commits: dict[str, Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    commit_times: list[float] = field(default_factory=list)


class FakeHub:
    """The Hub's state, shared by every request handler thread under one lock."""

    def __init__(self, commit_budget: int = 10_000, window: float = 3600.0,
                 max_file_size: int = 50 * 1024**3, api_budget: int = 1_000_000,
                 api_window: float = 300.0) -> None:
        self.repos: dict[tuple[str, str], Repo] = {}
        self.lfs: dict[str, bytes] = {}
        self.lock = threading.Lock()
        self.commit_budget = commit_budget
        self.window = window
        self.max_file_size = max_file_size
        self.api_budget = api_budget
        self.api_window = api_window
        self.api_times: list[float] = []
        self.lfs_uploads = 0
        """LFS objects uploaded (the basic transfer's PUTs): bytes that went up."""
        self.refused: list[str] = []
        """Why requests were refused (412, 429, …), in order: what a test asserts on."""
        self.endpoint = ""

    def create(self, repo_type: str, repo_id: str, private: bool = True) -> Repo:
        """Make a repo with the Hub's first commit (a ``.gitattributes``)."""
        repo = Repo(private)
        first = Commit(secrets.token_hex(20), None,
                       {".gitattributes": Entry(b"*.bin filter=lfs diff=lfs merge=lfs -text\n")},
                       "initial commit", time.time())
        repo.commits[first.sha] = first
        repo.branches["main"] = first.sha
        self.repos[(repo_type, repo_id)] = repo
        return repo

    def head(self, repo_type: str, repo_id: str, revision: str = "main") -> Commit:
        """The commit ``revision`` (a branch or a commit sha) names."""
        repo = self.repos[(repo_type, repo_id)]
        return repo.commits[repo.branches.get(revision, revision)]

    def commits(self, repo_type: str, repo_id: str, revision: str = "main") -> list[Commit]:
        """The branch's history, newest first."""
        repo = self.repos[(repo_type, repo_id)]
        out, sha = [], repo.branches.get(revision)
        while sha is not None:
            out.append(repo.commits[sha])
            sha = repo.commits[sha].parent
        return out


class _Reply(Exception):
    def __init__(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        super().__init__(status)
        self.status, self.body, self.headers = status, body, headers or {}


def _error(status: int, message: str, code: str | None = None,
           headers: dict[str, str] | None = None) -> _Reply:
    extra = {"X-Error-Message": message, **(headers or {})}
    if code:
        extra["X-Error-Code"] = code
    return _Reply(status, {"error": message}, extra)


REPO_ROUTE = re.compile(r"^/api/(models|datasets)/([^/]+/[^/]+)/"
                        r"(revision|tree|paths-info|preupload|commit)/([^/]+)(?:/(.*))?$")
LFS_ROUTE = re.compile(r"^/(datasets/)?([^/]+/[^/]+)\.git/info/lfs/objects/batch$")
BRANCH_ROUTE = re.compile(r"^/api/(models|datasets)/([^/]+/[^/]+)/branch/([^/]+)$")
INFO_ROUTE = re.compile(r"^/api/(models|datasets)/([^/]+/[^/]+)$")
RESOLVE_ROUTE = re.compile(r"^/(datasets/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def do_GET(self) -> None:
        self._serve("GET")

    def do_HEAD(self) -> None:
        self._serve("HEAD")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def _serve(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        url = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(url.path)
        query = urllib.parse.parse_qs(url.query)
        try:
            self._route(method, path, query, body)
        except _Reply as reply:
            self._send(reply.status, reply.body, reply.headers, head=method == "HEAD")

    def _send(self, status: int, body: Any, headers: dict[str, str], head: bool = False) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        if not isinstance(body, bytes):
            self.send_header("Content-Type", "application/json")
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", headers.get("Content-Length", str(len(data))))
        self.end_headers()
        if not head:
            self.wfile.write(data)

    def _auth(self) -> None:
        given = self.headers.get("Authorization", "")
        if given and given not in (f"Bearer {TOKEN}", f"Bearer {READ_TOKEN}"):
            raise _error(401, "Invalid credentials in Authorization header")
        if not given:
            raise _error(401, "Repository not found", "RepoNotFound")

    def _route(self, method: str, path: str, query: dict[str, list[str]], body: bytes) -> None:
        hub = self.server.hub
        if not path.startswith("/lfs-upload/"):  # a presigned storage URL on the Hub
            self._auth()
        with hub.lock:
            if path.startswith("/api/") and "/commit/" not in path:
                self._api_call()
            writing = path == "/api/repos/create" or bool(LFS_ROUTE.match(path)) or bool(
                BRANCH_ROUTE.match(path)) or (
                method == "POST" and ("/preupload/" in path or "/commit/" in path))
            if writing and self.headers.get("Authorization") == f"Bearer {READ_TOKEN}":
                raise _error(403, "You don't have write access to this repository "
                                  "(the token's role is read)")
            if path == "/api/repos/create" and method == "POST":
                self._create_repo(json.loads(body))
            if path == "/api/validate-yaml" and method == "POST":  # a README's model card
                raise _Reply(200, {"errors": [], "warnings": []})
            if path == "/api/whoami-v2":
                raise _Reply(200, {"type": "user", "name": "traind", "orgs": [],
                                   "auth": {"accessToken": {"role": "write"}}})
            if (m := BRANCH_ROUTE.match(path)) and method == "POST":
                self._create_branch(m.group(1)[:-1], m.group(2),
                                    urllib.parse.unquote(m.group(3)), json.loads(body or b"{}"))
            if m := REPO_ROUTE.match(path):
                kind, repo_id, verb, rev, rest = m.groups()
                self._repo(method, kind[:-1], repo_id, verb, rev, rest or "", query, body)
            if m := INFO_ROUTE.match(path):
                kind, repo_id = m.groups()
                self._repo(method, kind[:-1], repo_id, "revision", "main", "", query, body)
            if m := LFS_ROUTE.match(path):
                self._lfs_batch("dataset" if m.group(1) else "model", m.group(2), json.loads(body))
            if path.startswith("/lfs-upload/") and method == "PUT":
                oid = path.rsplit("/", 1)[1]
                if hashlib.sha256(body).hexdigest() != oid:
                    raise _error(400, "sha256 of the uploaded bytes does not match the oid")
                hub.lfs[oid] = body
                hub.lfs_uploads += 1
                raise _Reply(200, b"")
            if path == "/lfs-verify" and method == "POST":
                want = json.loads(body)
                if len(hub.lfs.get(want["oid"], b"")) != want["size"] or want["oid"] not in hub.lfs:
                    raise _error(404, "Object not found")
                raise _Reply(200, {})
            if (m := RESOLVE_ROUTE.match(path)) and method in ("GET", "HEAD"):
                self._resolve("dataset" if m.group(1) else "model", m.group(2),
                              m.group(3), m.group(4))
        raise _error(404, "Not found")

    def _api_call(self) -> None:
        """Count one call to ``/api/``; past ``api_budget`` in ``api_window``, 429."""
        hub = self.server.hub
        now = time.time()
        hub.api_times = [t for t in hub.api_times if t > now - hub.api_window]
        if len(hub.api_times) >= hub.api_budget:
            reset = int(hub.api_times[0] + hub.api_window - now) + 1
            hub.refused.append("429-api")
            raise _error(429, "You have exceeded the rate limit for API calls", None, {
                "RateLimit": f'"api";r=0;t={reset}',
                "RateLimit-Policy": f'"fixed window";"api";q={hub.api_budget};'
                                    f'w={int(hub.api_window)}'})
        hub.api_times.append(now)

    def _repo_of(self, repo_type: str, repo_id: str) -> Repo:
        repo = self.server.hub.repos.get((repo_type, repo_id))
        if repo is None:
            raise _error(404, "Repository not found", "RepoNotFound")
        return repo

    def _commit_of(self, repo: Repo, rev: str) -> Commit:
        sha = repo.branches.get(rev, rev)
        if sha not in repo.commits:
            raise _error(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        return repo.commits[sha]

    def _create_repo(self, want: dict[str, Any]) -> None:
        hub = self.server.hub
        repo_type = want.get("type") or "model"
        repo_id = f"{want.get('organization') or 'traind'}/{want['name']}"
        prefix = "" if repo_type == "model" else f"{repo_type}s/"
        url = f"{hub.endpoint}/{prefix}{repo_id}"
        if (repo_type, repo_id) in hub.repos:
            message = f"You already created this {repo_type} repo"
            raise _Reply(409, {"error": message, "url": url}, {"X-Error-Message": message})
        hub.create(repo_type, repo_id, bool(want.get("private")))
        raise _Reply(200, {"url": url, "name": repo_id})

    def _create_branch(self, repo_type: str, repo_id: str, branch: str,
                       want: dict[str, Any]) -> None:
        """``create_branch``: ``POST .../branch/{branch}`` from ``startingPoint`` (the
        default branch's head without one); 409 when the branch exists."""
        repo = self._repo_of(repo_type, repo_id)
        if branch in repo.branches:
            raise _error(409, f"Reference already exists: refs/heads/{branch}")
        repo.branches[branch] = self._commit_of(repo, want.get("startingPoint") or "main").sha
        raise _Reply(200, {})

    def _repo(self, method: str, repo_type: str, repo_id: str, verb: str, rev: str,
              rest: str, query: dict[str, list[str]], body: bytes) -> None:
        repo = self._repo_of(repo_type, repo_id)
        commit = self._commit_of(repo, rev)
        if verb == "revision":
            raise _Reply(200, {"id": repo_id, "sha": commit.sha, "private": repo.private,
                               "siblings": [{"rfilename": p} for p in sorted(commit.tree)],
                               "lastModified": time.strftime("%Y-%m-%dT%H:%M:%S.000Z",
                                                             time.gmtime(commit.at))})
        if verb == "tree":
            self._tree(commit, rest.strip("/"), query)
        if verb == "paths-info":
            form = urllib.parse.parse_qs(body.decode())
            paths = form.get("paths", [])
            raise _Reply(200, [e for p in paths if (e := _describe(commit, p.strip("/")))])
        if verb == "preupload" and method == "POST":
            files = json.loads(body)["files"]
            out = []
            for f in files:
                mode = ("lfs" if f["path"].endswith(LFS_SUFFIXES) or f["size"] > REGULAR_LIMIT
                        else "regular")
                item = {"path": f["path"], "uploadMode": mode, "shouldIgnore": False}
                if (found := commit.tree.get(f["path"])) is not None:
                    item["oid"] = found.lfs if found.lfs else git_oid(found.data)
                out.append(item)
            raise _Reply(200, {"files": out, "commitOid": commit.sha})
        if verb == "commit" and method == "POST":
            self._commit(repo, repo_type, repo_id, rev, body)
        raise _error(404, "Not found")

    def _tree(self, commit: Commit, base: str, query: dict[str, list[str]]) -> None:
        recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
        prefix = f"{base}/" if base else ""
        if base and not any(p.startswith(prefix) for p in commit.tree):
            raise _error(404, f"{base} does not exist", "EntryNotFound")
        entries: dict[str, dict[str, Any]] = {}
        for path, entry in commit.tree.items():
            if not path.startswith(prefix):
                continue
            rest = path[len(prefix):].split("/")
            for depth in range(1, len(rest)):
                if not recursive and depth > 1:
                    break
                d = prefix + "/".join(rest[:depth])
                entries.setdefault(d, {"type": "directory", "path": d, "size": 0,
                                       "oid": hashlib.sha1(d.encode()).hexdigest()})
            if recursive or len(rest) == 1:
                entries[path] = entry.describe(path)
        ordered = [entries[k] for k in sorted(entries)]
        start = int(query.get("cursor", ["0"])[0])
        page = ordered[start:start + PAGE]
        headers = {}
        if start + PAGE < len(ordered):
            params = {k: v[0] for k, v in query.items()} | {"cursor": str(start + PAGE)}
            link = f"{self.server.hub.endpoint}{self.path.split('?')[0]}"
            headers["Link"] = f'<{link}?{urllib.parse.urlencode(params)}>; rel="next"'
        raise _Reply(200, page, headers)

    def _lfs_batch(self, repo_type: str, repo_id: str, want: dict[str, Any]) -> None:
        hub = self.server.hub
        self._repo_of(repo_type, repo_id)
        objects = []
        for obj in want["objects"]:
            if obj["size"] > hub.max_file_size:
                objects.append({"oid": obj["oid"], "size": obj["size"], "error": {
                    "code": 422, "message": f"Your file exceeds the maximum size of "
                                            f"{hub.max_file_size} bytes"}})
            elif obj["oid"] in hub.lfs:
                objects.append({"oid": obj["oid"], "size": obj["size"]})
            else:
                objects.append({"oid": obj["oid"], "size": obj["size"], "authenticated": True,
                                "actions": {
                                    "upload": {"href": f"{hub.endpoint}/lfs-upload/{obj['oid']}"},
                                    "verify": {"href": f"{hub.endpoint}/lfs-verify"}}})
        raise _Reply(200, {"transfer": "basic", "objects": objects})

    def _commit(self, repo: Repo, repo_type: str, repo_id: str, rev: str, body: bytes) -> None:
        hub = self.server.hub
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        header = next(x["value"] for x in lines if x["key"] == "header")
        if rev not in repo.branches:
            raise _error(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        now = time.time()
        repo.commit_times = [t for t in repo.commit_times if t > now - hub.window]
        if len(repo.commit_times) >= hub.commit_budget:
            reset = int(repo.commit_times[0] + hub.window - now) + 1
            hub.refused.append("429")
            raise _error(429, "You have exceeded the rate limit for repository commits", None, {
                "RateLimit": f'"commits";r=0;t={reset}',
                "RateLimit-Policy": f'"fixed window";"commits";q={hub.commit_budget};'
                                    f'w={int(hub.window)}'})
        parent = header.get("parentCommit")
        head = repo.commits[repo.branches[rev]]
        if parent is not None and not head.sha.startswith(parent):
            hub.refused.append("412")
            raise _error(412, "A commit has happened since. Please refresh and try again.")
        tree = dict(head.tree)
        for item in lines:
            key, value = item["key"], item["value"]
            if key == "file":
                tree[value["path"]] = Entry(base64.b64decode(value["content"]))
            elif key == "lfsFile":
                if value["oid"] not in hub.lfs:
                    raise _error(400, f"LFS file {value['path']} was not uploaded")
                tree[value["path"]] = Entry(hub.lfs[value["oid"]], value["oid"])
            elif key == "deletedFile":
                if tree.pop(value["path"], None) is None:
                    raise _error(404, "A file with this name doesn't exist", "EntryNotFound")
            elif key == "deletedFolder":
                folder = value["path"].rstrip("/") + "/"
                for p in [p for p in tree if p.startswith(folder)]:
                    del tree[p]
        sha = secrets.token_hex(20)
        repo.commits[sha] = Commit(sha, head.sha, tree, header.get("summary", ""), now)
        repo.branches[rev] = sha
        repo.commit_times.append(now)
        prefix = "" if repo_type == "model" else f"{repo_type}s/"
        raise _Reply(200, {"commitUrl": f"{hub.endpoint}/{prefix}{repo_id}/commit/{sha}",
                           "commitOid": sha, "success": True})

    def _resolve(self, repo_type: str, repo_id: str, rev: str, path: str) -> None:
        repo = self._repo_of(repo_type, repo_id)
        commit = self._commit_of(repo, urllib.parse.unquote(rev))
        entry = commit.tree.get(path)
        if entry is None:
            raise _error(404, "Entry not found", "EntryNotFound",
                         {"X-Repo-Commit": commit.sha})
        data = entry.data
        headers = {"X-Repo-Commit": commit.sha, "Accept-Ranges": "bytes",
                   "ETag": f'"{entry.lfs or git_oid(data)}"'}
        if entry.lfs:
            headers |= {"X-Linked-Etag": f'"{entry.lfs}"', "X-Linked-Size": str(len(data))}
        status = 200
        if (wanted := self.headers.get("Range")) and (m := re.match(r"bytes=(\d+)-(\d*)", wanted)):
            start = int(m.group(1))
            end = int(m.group(2)) + 1 if m.group(2) else len(data)
            if start >= len(data) and data:
                raise _Reply(416, b"", {"Content-Range": f"bytes */{len(data)}"})
            headers["Content-Range"] = f"bytes {start}-{min(end, len(data)) - 1}/{len(data)}"
            data, status = data[start:end], 206
        raise _Reply(status, data, headers)


def _describe(commit: Commit, path: str) -> dict[str, Any] | None:
    if (entry := commit.tree.get(path)) is not None:
        return entry.describe(path)
    if any(p.startswith(path + "/") for p in commit.tree):
        return {"type": "directory", "path": path, "size": 0,
                "oid": hashlib.sha1(path.encode()).hexdigest()}
    return None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    hub: FakeHub


@contextlib.contextmanager
def running_hub(hub: FakeHub | None = None) -> Iterator[FakeHub]:
    """Serve ``hub`` (a fresh one by default) on 127.0.0.1 until the block ends;
    ``hub.endpoint`` is its ``HF_ENDPOINT``."""
    hub = hub or FakeHub()
    server = _Server(("127.0.0.1", 0), _Handler)
    server.hub = hub
    hub.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="fake-hub", daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
