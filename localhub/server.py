"""A small stand-in for the Hugging Face Hub that the REAL ``huggingface_hub`` client can talk to.

Why it exists: tests and the offline demo must push, tag and download models and datasets without
network access, through the very client code that production uses (``huggingface_hub``, and
``datasets.load_dataset`` / lm-eval on top of it). So this server speaks the subset of
the Hub's HTTP protocol that ``huggingface_hub`` 1.33 actually sends (plain LFS, no Xet: run the
client with ``HF_HUB_DISABLE_XET=1``), stores repos on disk, and lets tests inject faults.
It is a test/demo tool, not a product: one process, one lock, no pagination, model and dataset
repos (no Spaces, no dataset viewer: ``datasets`` asks ``datasets-server.<host>`` for a parquet
export, cannot reach it and reads the repo's own files, as it does for a fresh Hub dataset).

A repo is named by its path in the Hub's URLs (its *key*): ``ns/name`` for a model,
``datasets/ns/name`` for a dataset. The same routes serve both, under ``/api/models/...`` and
``/api/datasets/...``, ``/{key}/resolve/...`` and ``/{key}.git/info/lfs/objects/batch``.

Storage (under ``--root``)::

    blobs/<sha256>                          every file's bytes, stored once (content-addressed)
    models/<ns>/<name>/repo.json            private flag, branches {name: sha}, tags {name: {commit, message}}
    models/<ns>/<name>/commits/<sha>.json   a full tree {path: {size, sha256, oid, lfs}} + parent + message
    models/<ns>/<name>/lfs/<sha256>         marker: this repo received that LFS object (as on the Hub,
                                            LFS objects belong to a repo, even though bytes are shared)
    datasets/<ns>/<name>/...                the same, for a dataset repo

A commit's sha is sha1 over a canonical JSON of (tree, parent, message), so the same content on
the same parent always gets the same 40-hex id, and every commit is a complete snapshot.

Faults (admin endpoint, deliberately not under ``/api``): ``POST /_faults`` with
``{"fail_next": N, "status": 500}`` (the next N requests answer that status),
``{"drop_next_upload": true | N, "drop_on": "any" | "lfs" | "commit"}`` (the next LFS PUT or
commit POST reads half its body and closes the connection without answering: nothing is stored),
``{"drop_next_commit_response": true}`` (the next commit IS applied, then the connection closes
before the answer: the "did my push land?" case). ``GET /_requests`` returns the request log.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import hmac
import json
import os
import re
import secrets
import shutil
import socket
import tempfile
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

SHA40 = re.compile(r"^[0-9a-f]{40}$")
SHA64 = re.compile(r"^[0-9a-f]{64}$")
REPO_TYPES = {"model": "", "dataset": "datasets/"}  # repo type -> its prefix in the Hub's URLs
NAME = re.compile(r"^[A-Za-z0-9][\w.-]*$")
LFS_THRESHOLD = 10 * 1024 * 1024  # the Hub sends files of 10 MiB and more through LFS
# The .gitattributes the Hub writes into every new repo (abridged): these patterns go to LFS.
GITATTRIBUTES = "".join(
    f"{pattern} filter=lfs diff=lfs merge=lfs -text\n"
    for pattern in (
        "*.7z",
        "*.arrow",
        "*.bin",
        "*.bz2",
        "*.ckpt",
        "*.gguf",
        "*.gz",
        "*.h5",
        "*.joblib",
        "*.model",
        "*.msgpack",
        "*.npy",
        "*.npz",
        "*.onnx",
        "*.ot",
        "*.parquet",
        "*.pb",
        "*.pickle",
        "*.pkl",
        "*.pt",
        "*.pth",
        "*.rar",
        "*.safetensors",
        "*.tar",
        "*.tar.*",
        "*.tflite",
        "*.tgz",
        "*.wasm",
        "*.xz",
        "*.zip",
        "*.zst",
        "*tfevents*",
    )
)


class HttpError(Exception):
    """An answer with an error status, the Hub's ``X-Error-Code`` and a JSON ``{"error": ...}``."""

    def __init__(self, status: int, message: str, code: str | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.extra = status, message, code, extra


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def git_blob_sha(data: bytes) -> str:
    """The git object id of a blob, which is what the Hub calls a regular file's ``oid``."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def repo_key(repo_type: str, repo_id: str) -> str:
    """A repo's path in the Hub's URLs: ``ns/name`` (model) or ``datasets/ns/name`` (dataset)."""
    if repo_type not in REPO_TYPES:
        raise HttpError(400, f"the local hub stores model and dataset repos, not {repo_type!r} repos")
    return REPO_TYPES[repo_type] + repo_id


def split_key(key: str) -> tuple[str, str]:
    """(repo type, repo id) of a repo key."""
    if key.startswith("datasets/"):
        return "dataset", key.removeprefix("datasets/")
    return "model", key


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class Store:
    """Repos, commits, refs and blobs on disk. One lock: writes are rare and tiny here."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        (self.root / "blobs").mkdir(parents=True, exist_ok=True)
        self.lock = threading.RLock()

    # blobs -------------------------------------------------------------------------------
    def blob_path(self, sha256: str) -> Path:
        return self.root / "blobs" / sha256

    def put_blob(self, data: bytes) -> str:
        sha = hashlib.sha256(data).hexdigest()
        if not self.blob_path(sha).exists():
            _write_atomic(self.blob_path(sha), data)
        return sha

    # repos -------------------------------------------------------------------------------
    def repo_dir(self, repo_id: str) -> Path:
        """Where a repo lives; ``repo_id`` is its key (``ns/name`` or ``datasets/ns/name``)."""
        repo_type, plain_id = split_key(repo_id)
        return self.root / f"{repo_type}s" / plain_id

    def load_repo(self, repo_id: str) -> dict[str, Any]:
        path = self.repo_dir(repo_id) / "repo.json"
        if not path.is_file():
            raise HttpError(404, "Repository not found", "RepoNotFound")
        return json.loads(path.read_text())

    def save_repo(self, repo_id: str, repo: dict[str, Any]) -> None:
        _write_atomic(self.repo_dir(repo_id) / "repo.json", json.dumps(repo, indent=1).encode())

    def create_repo(self, repo_id: str, *, private: bool, url: str) -> None:
        with self.lock:
            if (self.repo_dir(repo_id) / "repo.json").is_file():  # the Hub's 409 carries the url too
                kind = split_key(repo_id)[0]
                raise HttpError(409, f"You already created this {kind} repo", None, url=url)
            blob = GITATTRIBUTES.encode()
            tree = {".gitattributes": self._entry(blob, lfs=False)}
            sha = self.write_commit(repo_id, tree, None, "initial commit", "")
            self.save_repo(
                repo_id, {"private": private, "createdAt": _now(), "branches": {"main": sha}, "tags": {}}
            )

    # commits -----------------------------------------------------------------------------
    def _entry(self, data: bytes, *, lfs: bool) -> dict[str, Any]:
        sha256 = self.put_blob(data)
        oid = git_blob_sha(lfs_pointer(sha256, len(data))) if lfs else git_blob_sha(data)
        return {"size": len(data), "sha256": sha256, "oid": oid, "lfs": lfs}

    def write_commit(
        self, repo_id: str, tree: dict[str, Any], parent: str | None, summary: str, description: str
    ) -> str:
        canonical = json.dumps(
            {"tree": tree, "parent": parent, "message": [summary, description]},
            sort_keys=True,
            separators=(",", ":"),
        ).encode()
        sha = hashlib.sha1(canonical).hexdigest()
        path = self.repo_dir(repo_id) / "commits" / f"{sha}.json"
        if not path.exists():
            _write_atomic(
                path,
                json.dumps(
                    {
                        "tree": tree,
                        "parent": parent,
                        "summary": summary,
                        "description": description,
                        "date": _now(),
                    }
                ).encode(),
            )
        return sha

    def has_lfs(self, repo_id: str, oid: str) -> bool:
        return (self.repo_dir(repo_id) / "lfs" / oid).exists() and self.blob_path(oid).exists()

    def load_commit(self, repo_id: str, sha: str) -> dict[str, Any]:
        return json.loads((self.repo_dir(repo_id) / "commits" / f"{sha}.json").read_text())

    def resolve(self, repo_id: str, rev: str) -> str:
        """Branch, then tag, then full commit sha (like the Hub: no short shas)."""
        repo = self.load_repo(repo_id)
        name = rev.removeprefix("refs/heads/").removeprefix("refs/tags/")
        if name in repo["branches"]:
            return repo["branches"][name]
        if name in repo["tags"]:
            return repo["tags"][name]["commit"]
        if SHA40.match(rev) and (self.repo_dir(repo_id) / "commits" / f"{rev}.json").is_file():
            return rev
        raise HttpError(404, f"Invalid rev id: {rev}", "RevisionNotFound")


@dataclass
class Faults:
    """Injected failures; consumed by the requests they hit."""

    fail_next: int = 0
    status: int = 500
    drop_next_upload: int = 0
    drop_on: str = "any"  # "any" | "lfs" | "commit"
    drop_next_commit_response: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def update(self, spec: dict[str, Any]) -> None:
        with self.lock:
            if "fail_next" in spec:
                self.fail_next, self.status = int(spec["fail_next"]), int(spec.get("status", 500))
            if "drop_next_upload" in spec:
                self.drop_next_upload = int(spec["drop_next_upload"])
                self.drop_on = spec.get("drop_on", "any")
            if "drop_next_commit_response" in spec:
                self.drop_next_commit_response = int(spec["drop_next_commit_response"])

    def take(self, name: str) -> bool:
        with self.lock:
            if getattr(self, name) > 0:
                setattr(self, name, getattr(self, name) - 1)
                return True
            return False


@dataclass(frozen=True)
class RequestRecord:
    method: str
    path: str
    status: int  # 0 = connection dropped on purpose


class HubServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        addr: tuple[str, int],
        root: Path,
        *,
        tokens: tuple[str, ...] = (),
        read_tokens: tuple[str, ...] = (),
        log_requests: bool = False,
    ) -> None:
        super().__init__(addr, Handler)
        self.store = Store(root)
        self.tokens, self.read_tokens = tuple(tokens), tuple(read_tokens)
        self.faults = Faults()
        self.requests: list[RequestRecord] = []
        self.log_requests = log_requests
        self.upload_key = secrets.token_bytes(16)  # signs LFS upload URLs (the Hub presigns S3 ones)

    def sign(self, oid: str) -> str:
        return hmac.new(self.upload_key, oid.encode(), hashlib.sha256).hexdigest()[:32]


class Handler(BaseHTTPRequestHandler):
    server: HubServer
    protocol_version = "HTTP/1.1"  # keep-alive, as httpx expects
    disable_nagle_algorithm = True  # headers and body go out as separate writes: no 40 ms stalls

    # plumbing ----------------------------------------------------------------------------
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def _record(self, status: int) -> None:
        self.server.requests.append(RequestRecord(self.command, self.path, status))
        if self.server.log_requests:
            print(f"{self.command} {self.path} -> {status or 'DROPPED'}", flush=True)

    def _body(self) -> bytes:
        if getattr(self, "_cached_body", None) is not None:
            return self._cached_body
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                parts.append(self.rfile.read(size))
                self.rfile.readline()
            data = b"".join(parts)
        else:
            length = int(self.headers.get("Content-Length") or 0)
            data = self.rfile.read(length) if length else b""
        self._cached_body = data
        return data

    def _json_body(self) -> Any:
        raw = self._body()
        try:
            return json.loads(raw) if raw else {}
        except ValueError:
            raise HttpError(400, "body is not valid JSON") from None

    def _send(
        self,
        status: int,
        body: Any = b"",
        headers: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self._record(status)  # before answering: once the client has the answer, the log has it
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")  # so the client does not reuse this socket
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _drop(self) -> None:
        """Read about half the body, then hang up without a word (a dying proxy or network)."""
        length = int(self.headers.get("Content-Length") or 0)
        self._record(0)
        try:
            if self._cached_body is None and length:
                self.rfile.read(max(length // 2, 1))
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.close_connection = True

    @property
    def base_url(self) -> str:
        return f"http://{self.headers.get('Host') or '%s:%d' % self.server.server_address[:2]}"

    # dispatch ----------------------------------------------------------------------------
    def do_GET(self) -> None:
        self._dispatch()

    do_HEAD = do_POST = do_PUT = do_DELETE = do_GET

    def _dispatch(self) -> None:
        self._cached_body = None
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.split("/")[1:]]
        query = parse_qs(url.query)
        try:
            if parts[:1] == ["_faults"] and self.command == "POST":
                self.server.faults.update(self._json_body())
                return self._send(200, {"ok": True})
            if parts[:1] == ["_requests"]:
                return self._send(200, [r.__dict__ for r in self.server.requests])
            is_upload = parts[:1] == ["_lfs"] and self.command == "PUT"
            is_commit = (
                len(parts) >= 6
                and parts[:2] in (["api", "models"], ["api", "datasets"])
                and parts[4] == "commit"
            )
            faults = self.server.faults
            on = faults.drop_on
            if (is_upload and on in ("any", "lfs")) or (is_commit and on in ("any", "commit")):
                if faults.take("drop_next_upload"):
                    return self._drop()
            if faults.fail_next > 0 and faults.take("fail_next"):
                self._body()
                self.close_connection = True
                raise HttpError(faults.status, f"injected fault: HTTP {faults.status}")
            if not is_upload:
                self._check_auth(parts)
            self._route(parts, query)
        except HttpError as err:
            try:
                self._body()  # never leave a body unread on a kept-alive connection
            except (OSError, ValueError):
                self.close_connection = True
            headers = {"X-Error-Message": err.message.encode("ascii", "replace").decode()}
            if err.code:
                headers["X-Error-Code"] = err.code
            if err.status == 429:  # the Hub's rate limit says when to come back
                headers["Retry-After"] = "1"
            self._send(err.status, {"error": err.message, **err.extra}, headers)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # a bug here: answer it (with its name) rather than hang up
            self.close_connection = True
            self._send(500, {"error": f"local hub bug: {type(exc).__name__}: {exc}"})

    def _check_auth(self, parts: list[str]) -> None:
        server = self.server
        if not (server.tokens or server.read_tokens):
            return
        given = self.headers.get("Authorization", "")
        token = given[7:] if given.lower().startswith("bearer ") else None
        if token in server.tokens:
            return
        if token in server.read_tokens:
            read_only_post = parts[:2] == ["api", "validate-yaml"] or "paths-info" in parts
            if self.command in ("GET", "HEAD") or read_only_post:
                return
            self._body()
            raise HttpError(403, "You don't have the rights to write to this repo: the token is read-only")
        self._body()
        raise HttpError(401, "Invalid credentials in Authorization header")

    def _route(self, p: list[str], q: dict[str, list[str]]) -> None:
        m = self.command
        if p[:1] == ["api"]:
            if p[1:3] == ["repos", "create"] and m == "POST":
                return self._create_repo()
            if p[1:3] == ["repos", "delete"] and m == "DELETE":
                return self._delete_repo()
            if p[1:2] == ["validate-yaml"] and m == "POST":
                self._body()
                return self._send(200, {"errors": [], "warnings": []})
            if p[1:2] == ["whoami-v2"]:
                return self._send(200, {"type": "user", "name": "local", "auth": {}})
            if p[1:2] in (["models"], ["datasets"]) and len(p) >= 4:
                key, rest = repo_key(p[1][:-1], f"{p[2]}/{p[3]}"), p[4:]
                self.server.store.load_repo(key)  # 404 RepoNotFound first, as the Hub does
                return self._repo_api(key, rest, q)
        if p[:1] == ["_lfs"] and m == "PUT" and len(p) in (4, 5):
            return self._lfs_put("/".join(p[1:-1]), p[-1], q)
        prefix = 1 if p[:1] == ["datasets"] else 0  # /datasets/{ns}/{name}/... vs /{ns}/{name}/...
        key_parts, p = p[: prefix + 2], p[prefix:]
        if len(p) == 6 and p[1].endswith(".git") and p[2:6] == ["info", "lfs", "objects", "batch"]:
            return self._lfs_batch("/".join(key_parts)[:-4])
        if len(p) >= 5 and p[2] == "resolve" and m in ("GET", "HEAD"):
            return self._resolve_file("/".join(key_parts), p[3], "/".join(p[4:]))
        raise HttpError(404, f"no such endpoint on the local hub: {m} {self.path}")

    def _repo_api(self, repo_id: str, rest: list[str], q: dict[str, list[str]]) -> None:
        m, what, arg = self.command, (rest[0] if rest else ""), "/".join(rest[1:])
        if not rest and m == "GET":
            return self._send(200, self._info(repo_id, "main", q))
        if what == "revision" and m == "GET":
            return self._send(200, self._info(repo_id, arg, q))
        if what == "refs" and m == "GET":
            return self._send(200, self._refs(repo_id))
        if what == "tree" and m == "GET":
            rev, path = rest[1], "/".join(rest[2:])
            return self._send(200, self._tree(repo_id, rev, path, q))
        if what == "commits" and m == "GET":
            return self._send(200, self._commits(repo_id, rest[1]))
        if what == "paths-info" and m == "POST":
            return self._send(200, self._paths_info(repo_id, rest[1]))
        if what == "preupload" and m == "POST":
            return self._send(200, self._preupload(repo_id, rest[1]))
        if what == "commit" and m == "POST":
            return self._commit(repo_id, rest[1])
        if what in ("tag", "branch") and m in ("POST", "DELETE"):
            return self._ref_change(repo_id, what, arg)
        if what.startswith("xet-"):
            raise HttpError(400, "this local hub speaks plain LFS, not Xet: set HF_HUB_DISABLE_XET=1")
        raise HttpError(404, f"no such endpoint on the local hub: {m} {self.path}")

    # repos -------------------------------------------------------------------------------
    def _create_repo(self) -> None:
        body = self._json_body()
        name, org = body.get("name", ""), body.get("organization") or "local"
        key = repo_key(body.get("type") or "model", f"{org}/{name}")
        if not (NAME.match(name) and NAME.match(org)):
            raise HttpError(400, f"invalid repo name: {org}/{name}")
        private = body.get("private", body.get("visibility") == "private")
        url = f"{self.base_url}/{key}"
        self.server.store.create_repo(key, private=bool(private), url=url)
        self._send(200, {"url": url, "name": f"{org}/{name}"})

    def _delete_repo(self) -> None:
        body = self._json_body()
        repo_id = repo_key(
            body.get("type") or "model", f"{body.get('organization') or 'local'}/{body.get('name')}"
        )
        store = self.server.store
        with store.lock:
            store.load_repo(repo_id)
            shutil.rmtree(store.repo_dir(repo_id))
        self._send(200, {})

    def _info(self, repo_id: str, rev: str, q: dict[str, list[str]]) -> dict[str, Any]:
        store = self.server.store
        repo, sha = store.load_repo(repo_id), store.resolve(repo_id, rev)
        commit = store.load_commit(repo_id, sha)
        blobs = q.get("blobs", ["false"])[0].lower() in ("1", "true")
        siblings = []
        for path, e in sorted(commit["tree"].items()):
            s: dict[str, Any] = {"rfilename": path}
            if blobs:
                s.update(size=e["size"], blobId=e["oid"])
                if e["lfs"]:
                    s["lfs"] = {
                        "size": e["size"],
                        "sha256": e["sha256"],
                        "pointerSize": len(lfs_pointer(e["sha256"], e["size"])),
                    }
            siblings.append(s)
        repo_type, plain_id = split_key(repo_id)
        info: dict[str, Any] = {
            "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24],
            "id": plain_id,
            "author": plain_id.split("/")[0],
            "sha": sha,
            "private": repo["private"],
            "disabled": False,
            "gated": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "createdAt": repo["createdAt"],
            "lastModified": commit["date"],
            "siblings": siblings,
        }
        if repo_type == "model":
            info["modelId"] = plain_id
        card = commit["tree"].get("README.md")
        if card:
            info["cardData"] = _card_data(store.blob_path(card["sha256"]).read_text(errors="replace"))
        return info

    def _refs(self, repo_id: str) -> dict[str, Any]:
        repo = self.server.store.load_repo(repo_id)
        return {
            "branches": [
                {"name": n, "ref": f"refs/heads/{n}", "targetCommit": s}
                for n, s in sorted(repo["branches"].items())
            ],
            # "message" is an extra the client ignores; tests read it to see what a tag records.
            "tags": [
                {"name": n, "ref": f"refs/tags/{n}", "targetCommit": t["commit"], "message": t["message"]}
                for n, t in sorted(repo["tags"].items())
            ],
            "converts": [],
            "pullRequests": [],
        }

    def _file_json(self, path: str, e: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "file", "oid": e["oid"], "size": e["size"], "path": path}
        if e["lfs"]:
            out["lfs"] = {
                "oid": e["sha256"],
                "size": e["size"],
                "pointerSize": len(lfs_pointer(e["sha256"], e["size"])),
            }
        return out

    def _tree(self, repo_id: str, rev: str, path: str, q: dict[str, list[str]]) -> list[dict[str, Any]]:
        store = self.server.store
        tree = store.load_commit(repo_id, store.resolve(repo_id, rev))["tree"]
        recursive = q.get("recursive", ["false"])[0].lower() in ("1", "true")
        prefix = f"{path.strip('/')}/" if path.strip("/") else ""
        if prefix and not any(f.startswith(prefix) for f in tree):
            raise HttpError(404, f'{path} does not exist on "{rev}"', "EntryNotFound")
        files, dirs = [], set()
        for f, e in sorted(tree.items()):
            if not f.startswith(prefix):
                continue
            rel = f[len(prefix) :].split("/")
            for depth in range(1, len(rel)):
                if recursive or depth == 1:
                    dirs.add(prefix + "/".join(rel[:depth]))
            if recursive or len(rel) == 1:
                files.append(self._file_json(f, e))
        folders = [
            {"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0, "path": d}
            for d in sorted(dirs)
        ]
        return folders + files

    def _paths_info(self, repo_id: str, rev: str) -> list[dict[str, Any]]:
        store = self.server.store
        tree = store.load_commit(repo_id, store.resolve(repo_id, rev))["tree"]
        form = parse_qs(self._body().decode())
        out = []
        for path in form.get("paths", []):
            if path in tree:
                out.append(self._file_json(path, tree[path]))
            elif any(f.startswith(path.rstrip("/") + "/") for f in tree):
                out.append(
                    {
                        "type": "directory",
                        "oid": hashlib.sha1(path.encode()).hexdigest(),
                        "size": 0,
                        "path": path,
                    }
                )
        return out

    def _commits(self, repo_id: str, rev: str) -> list[dict[str, Any]]:
        store = self.server.store
        sha: str | None = store.resolve(repo_id, rev)
        out = []
        while sha:
            c = store.load_commit(repo_id, sha)
            out.append(
                {
                    "id": sha,
                    "title": c["summary"],
                    "message": c["description"],
                    "authors": [{"user": "local"}],
                    "date": c["date"],
                }
            )
            sha = c["parent"]
        return out

    # uploads -----------------------------------------------------------------------------
    def _branch_head(self, repo_id: str, rev: str) -> str:
        repo = self.server.store.load_repo(repo_id)
        if rev not in repo["branches"]:
            raise HttpError(
                404, f"Invalid rev id: {rev} (commits go to an existing branch)", "RevisionNotFound"
            )
        return repo["branches"][rev]

    def _preupload(self, repo_id: str, rev: str) -> dict[str, Any]:
        store = self.server.store
        head = self._branch_head(repo_id, rev)
        tree = store.load_commit(repo_id, head)["tree"]
        patterns = _lfs_patterns(store, tree)
        files = []
        for f in self._json_body().get("files", []):
            sample = base64.b64decode(f.get("sample", ""))
            name = f["path"].rsplit("/", 1)[-1]
            lfs = (
                f.get("size", 0) >= LFS_THRESHOLD
                or b"\0" in sample
                or any(fnmatch.fnmatch(name, p) or fnmatch.fnmatch(f["path"], p) for p in patterns)
            )
            item: dict[str, Any] = {
                "path": f["path"],
                "uploadMode": "lfs" if lfs else "regular",
                "shouldIgnore": False,
            }
            existing = tree.get(f["path"])
            if existing:  # lets the client skip unchanged files (sha256 for LFS, git sha1 otherwise)
                item["oid"] = existing["sha256"] if existing["lfs"] else existing["oid"]
            files.append(item)
        return {"files": files, "commitOid": head}

    def _lfs_batch(self, repo_id: str) -> None:
        self.server.store.load_repo(repo_id)
        body = self._json_body()
        if body.get("operation") != "upload":
            raise HttpError(400, "the local hub's LFS endpoint handles uploads only")
        objects = []
        for obj in body.get("objects", []):
            oid, size = str(obj.get("oid", "")), int(obj.get("size", 0))
            if not SHA64.match(oid):
                raise HttpError(400, f"invalid LFS oid {oid!r}")
            item: dict[str, Any] = {"oid": oid, "size": size, "authenticated": True}
            if not self.server.store.has_lfs(repo_id, oid):
                href = (
                    f"{self.base_url}/_lfs/{repo_id}/{oid}?size={size}"
                    f"&sig={self.server.sign(f'{repo_id}/{oid}')}"
                )
                item["actions"] = {"upload": {"href": href, "header": {}, "expires_in": 3600}}
            objects.append(item)
        self._send(
            200,
            {"transfer": "basic", "objects": objects, "hash_algo": "sha256"},
            content_type="application/vnd.git-lfs+json",
        )

    def _lfs_put(self, repo_id: str, oid: str, q: dict[str, list[str]]) -> None:
        """The upload URL handed out by the batch call: signed, so it needs no token (like S3's)."""
        signature = self.server.sign(f"{repo_id}/{oid}")
        if not (SHA64.match(oid) and hmac.compare_digest(q.get("sig", [""])[0], signature)):
            raise HttpError(403, "invalid or missing upload signature")
        data = self._body()
        if hashlib.sha256(data).hexdigest() != oid:
            raise HttpError(400, f"uploaded bytes do not hash to {oid} (got {len(data)} bytes)")
        store = self.server.store
        store.put_blob(data)
        _write_atomic(store.repo_dir(repo_id) / "lfs" / oid, b"")
        self._send(200, b"", content_type="text/plain")

    def _commit(self, repo_id: str, rev: str) -> None:
        store = self.server.store
        lines = [json.loads(line) for line in self._body().splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise HttpError(400, "the commit payload must start with a header line")
        header = lines[0]["value"]
        with store.lock:
            head = self._branch_head(repo_id, rev)
            parent = header.get("parentCommit")
            if parent and parent != head:
                raise HttpError(412, "A commit has happened since. Please refresh and try again.")
            tree = dict(store.load_commit(repo_id, head)["tree"])
            for line in lines[1:]:
                key, value = line.get("key"), line.get("value", {})
                path = str(value.get("path", "")).lstrip("/")
                if not path or ".." in path.split("/"):
                    raise HttpError(400, f"invalid path {path!r}")
                if key == "file":
                    tree[path] = store._entry(base64.b64decode(value["content"]), lfs=False)
                elif key == "lfsFile":
                    oid = value.get("oid", "")
                    if not (SHA64.match(oid) and store.has_lfs(repo_id, oid)):
                        raise HttpError(422, f"LFS object {oid} for {path} was never uploaded")
                    size = store.blob_path(oid).stat().st_size
                    tree[path] = {
                        "size": size,
                        "sha256": oid,
                        "lfs": True,
                        "oid": git_blob_sha(lfs_pointer(oid, size)),
                    }
                elif key == "deletedFile":
                    if tree.pop(path, None) is None:
                        raise HttpError(404, "A file with this name doesn't exist", "EntryNotFound")
                elif key == "deletedFolder":
                    gone = [f for f in tree if f.startswith(path.rstrip("/") + "/")]
                    if not gone:
                        raise HttpError(404, "A folder with this name doesn't exist", "EntryNotFound")
                    for f in gone:
                        del tree[f]
                else:
                    raise HttpError(400, f"unknown commit operation {key!r}")
            sha = store.write_commit(
                repo_id, tree, head, header.get("summary", ""), header.get("description", "")
            )
            repo = store.load_repo(repo_id)
            repo["branches"][rev] = sha
            store.save_repo(repo_id, repo)
        if self.server.faults.take("drop_next_commit_response"):
            return self._drop()
        self._send(
            200,
            {
                "success": True,
                "commitOid": sha,
                "hookOutput": "",
                "commitUrl": f"{self.base_url}/{repo_id}/commit/{sha}",
            },
        )

    # refs --------------------------------------------------------------------------------
    def _ref_change(self, repo_id: str, kind: str, arg: str) -> None:
        store = self.server.store
        with store.lock:
            repo = store.load_repo(repo_id)
            refs = repo["tags"] if kind == "tag" else repo["branches"]
            if self.command == "DELETE":
                if arg not in refs:
                    raise HttpError(404, f"Invalid rev id: {arg}", "RevisionNotFound")
                if kind == "branch" and arg == "main":
                    raise HttpError(400, "You cannot delete the default branch")
                del refs[arg]
            else:
                body = self._json_body()
                if kind == "tag":  # POST .../tag/{revision} {"tag", "message"}
                    name, target = body.get("tag", ""), store.resolve(repo_id, arg)
                else:  # POST .../branch/{name} {"startingPoint"}
                    name = arg
                    target = store.resolve(repo_id, body.get("startingPoint") or "main")
                if not NAME.match(name) or SHA40.match(name):
                    raise HttpError(400, f"invalid {kind} name {name!r}")
                if name in refs:
                    raise HttpError(409, f"{'Tag' if kind == 'tag' else 'Reference'} already exists")
                if kind == "tag":
                    refs[name] = {"commit": target, "message": body.get("message", "")}
                else:
                    refs[name] = target
            store.save_repo(repo_id, repo)
        self._send(200, {})

    # downloads ---------------------------------------------------------------------------
    def _resolve_file(self, repo_id: str, rev: str, path: str) -> None:
        store = self.server.store
        sha = store.resolve(repo_id, rev)
        e = store.load_commit(repo_id, sha)["tree"].get(path)
        if e is None:
            raise HttpError(404, f'{path} does not exist on "{rev}"', "EntryNotFound")
        blob = store.blob_path(e["sha256"])
        size, start, end, status = e["size"], 0, e["size"] - 1, 200
        rng = re.match(r"bytes=(\d*)-(\d*)$", self.headers.get("Range", ""))
        if rng and size:
            start = int(rng[1]) if rng[1] else max(size - int(rng[2] or 0), 0)
            end = min(int(rng[2]), size - 1) if rng[1] and rng[2] else size - 1
            status = 206
        etag = e["sha256"] if e["lfs"] else e["oid"]
        self._record(status)
        self.send_response(status)
        headers = {
            "Content-Type": "application/octet-stream",
            "Content-Length": str(max(end - start + 1, 0)),
            "Accept-Ranges": "bytes",
            "X-Repo-Commit": sha,
            "ETag": f'"{etag}"',
        }
        if e["lfs"]:
            headers.update({"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(size)})
        if status == 206:
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command == "GET":
            with blob.open("rb") as fh:
                fh.seek(start)
                left = end - start + 1
                while left > 0:
                    chunk = fh.read(min(left, 1 << 20))
                    if not chunk:
                        break
                    self.wfile.write(chunk)
                    left -= len(chunk)


def _lfs_patterns(store: Store, tree: dict[str, Any]) -> list[str]:
    e = tree.get(".gitattributes")
    text = store.blob_path(e["sha256"]).read_text(errors="replace") if e else GITATTRIBUTES
    return [line.split()[0] for line in text.splitlines() if "filter=lfs" in line and line.split()]


def _card_data(text: str) -> dict[str, Any] | None:
    """The YAML header of a model card, as the Hub returns it in ``cardData`` (if PyYAML exists)."""
    match = re.match(r"^---\s*\n(.*?)\n---\s*(\n|$)", text, re.S)
    if not match:
        return None
    try:
        import yaml

        data = yaml.safe_load(match[1])
    except Exception:  # a broken card must not break model_info
        return None
    return data if isinstance(data, dict) else None


class LocalHub:
    """A running local hub (in a background thread): ``.endpoint``, ``.inject(...)``, ``.stop()``."""

    def __init__(self, server: HubServer) -> None:
        self.server = server
        host, port = server.server_address[:2]
        self.endpoint = f"http://{host}:{port}"
        self.root = server.store.root
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="localhub", daemon=True
        )
        self._thread.start()

    @property
    def store(self) -> Store:
        return self.server.store

    @property
    def requests(self) -> list[RequestRecord]:
        return list(self.server.requests)

    def inject(
        self,
        *,
        fail_next: int = 0,
        status: int = 500,
        drop_next_upload: bool | int = False,
        drop_on: str = "any",
        drop_next_commit_response: bool | int = False,
    ) -> None:
        """Same effect as ``POST /_faults``."""
        spec: dict[str, Any] = {}
        if fail_next:
            spec.update(fail_next=fail_next, status=status)
        if drop_next_upload:
            spec.update(drop_next_upload=int(drop_next_upload), drop_on=drop_on)
        if drop_next_commit_response:
            spec["drop_next_commit_response"] = int(drop_next_commit_response)
        self.server.faults.update(spec)

    def clear_faults(self) -> None:
        """Forget every fault not yet consumed."""
        self.server.faults.update({"fail_next": 0, "drop_next_upload": 0, "drop_next_commit_response": 0})

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> LocalHub:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_local_hub(
    root: str | os.PathLike[str],
    *,
    tokens: tuple[str, ...] | list[str] = (),
    read_tokens: tuple[str, ...] | list[str] = (),
    port: int = 0,
    host: str = "127.0.0.1",
    log_requests: bool = False,
) -> LocalHub:
    """Start a local hub serving ``root`` (created if missing); use it as a context manager."""
    server = HubServer(
        (host, port),
        Path(root),
        tokens=tuple(tokens),
        read_tokens=tuple(read_tokens),
        log_requests=log_requests,
    )
    return LocalHub(server)


def serve(argv: list[str] | None = None) -> None:
    """``python -m localhub --root DIR [--host H] [--port P] [--token T ...] [--read-token T ...]``."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(prog="python -m localhub", description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=os.path.join(tempfile.gettempdir(), "localhub"))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed)")
    parser.add_argument("--token", action="append", default=[], help="accepted write token (repeatable)")
    parser.add_argument("--read-token", action="append", default=[], help="read-only token: writes get 403")
    parser.add_argument("--log-requests", action="store_true", help="print one line per request")
    args = parser.parse_args(argv)
    server = HubServer(
        (args.host, args.port),
        Path(args.root),
        tokens=tuple(args.token),
        read_tokens=tuple(args.read_token),
        log_requests=args.log_requests,
    )
    host, port = server.server_address[:2]
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"localhub serving {Path(args.root).resolve()} on http://{host}:{port}", flush=True)
    try:
        server.serve_forever(poll_interval=0.1)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
