"""The ``[storage]`` body of a fresh store of each kind, with a real server behind it, and a
view of what that store holds."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.requires import need_binary, need_module
from tests.support.seaweed import ACCESS_KEY, REGION, SECRET_KEY, SeaweedS3, running_seaweed
from tests.support.sshd import HOST, SSHServer


@dataclass
class StoreView:
    """What a store holds under one run, read beside the daemons: a directory on this
    machine (local, and SSH's remote side), or a SeaweedFS bucket."""

    run: str
    root: Path | None = None
    server: SeaweedS3 | None = None
    bucket: str = "ckpts"

    def _keys(self, prefix: str) -> list[str]:
        assert self.server is not None
        client = self.server.client()
        try:
            pages = client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                     Prefix=prefix)
            return [str(o["Key"])[len(prefix):] for page in pages
                    for o in page.get("Contents", [])]
        finally:
            client.close()

    def names(self, tag: str = "") -> list[str]:
        """Every file's path under ``<run>/<tag>/`` (under ``<run>/`` when no tag), sorted."""
        if self.root is not None:
            base = self.root / self.run / tag
            # os.walk passes over a directory pruned while it walks (rglob raises)
            return sorted(str((Path(d) / f).relative_to(base))
                          for d, _, files in os.walk(base) for f in files
                          if os.path.isfile(Path(d) / f))
        return sorted(self._keys(f"{self.run}/{tag}/" if tag else f"{self.run}/"))

    def tags(self) -> list[str]:
        """The tags with anything stored under them, committed or not."""
        return sorted({name.split("/", 1)[0] for name in self.names()})

    def read(self, tag: str, rel: str) -> bytes | None:
        """The bytes stored at ``<run>/<tag>/<rel>``, None when there are none."""
        if self.root is not None:
            path = self.root / self.run / tag / rel
            return path.read_bytes() if path.is_file() else None
        assert self.server is not None
        client = self.server.client()
        try:
            body = client.get_object(Bucket=self.bucket, Key=f"{self.run}/{tag}/{rel}")["Body"]
            return bytes(body.read())
        except client.exceptions.NoSuchKey:
            return None
        finally:
            client.close()

    def copy(self, tag: str, dest: Path) -> Path:
        """The tag's files as a directory on this machine (copied into ``dest`` from S3)."""
        if self.root is not None:
            return self.root / self.run / tag
        for rel in self.names(tag):
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(self.read(tag, rel) or b"")
        return dest


@contextmanager
def running_store(kind: str, tmp_path: Path, run: str = "run") -> Iterator[tuple[str, StoreView]]:
    """The [storage] body of a fresh ``kind`` store: ``local``, ``s3`` (a real SeaweedFS) or
    ``ssh`` / ``ssh-<transfer>`` (a real sshd), and a view of run ``run`` in it; its server
    is stopped on exit."""
    if kind == "local":
        yield (f'type = "local"\npath = "{tmp_path / "store"}"\n',
               StoreView(run, root=tmp_path / "store"))
        return
    if kind == "s3":
        need_module("aiobotocore")
        with running_seaweed(need_binary("weed"), tmp_path / "seaweed") as server:
            server.create_bucket("ckpts")
            yield (
                f'type = "s3"\nbucket = "ckpts"\nendpoint_url = "{server.endpoint}"\n'
                f'region = "{REGION}"\naddressing_style = "path"\n'
                f'access_key_id = "{ACCESS_KEY}"\nsecret_access_key = "{SECRET_KEY}"\n',
                StoreView(run, server=server),
            )
        return
    need_module("asyncssh")
    server = SSHServer(need_binary("sshd"), tmp_path / "sshd")
    server.start_sync()
    transfer = kind.removeprefix("ssh").removeprefix("-")
    try:
        yield (
            f'type = "ssh"\nhost = "{HOST}"\nport = {server.port}\nuser = "{server.user}"\n'
            f'identity_file = "{server.user_key.path}"\nknown_hosts = "{server.known_hosts}"\n'
            f'remote_path = "{tmp_path / "remote"}"\n'
            + (f'transfer = "{transfer}"\n' if transfer else ""),
            StoreView(run, root=tmp_path / "remote"),
        )
    finally:
        server.stop_sync()


@contextmanager
def store_section(kind: str, tmp_path: Path) -> Iterator[str]:
    """The [storage] body of a fresh ``kind`` store (see ``running_store``)."""
    with running_store(kind, tmp_path) as (section, _):
        yield section
