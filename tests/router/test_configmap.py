"""A ConfigMap volume's update as the kubelet makes it: the watcher follows the `..data` symlink swap even when the
file's own mtime and size stay the same, and a broken update keeps the running policies."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest

from policies import load_config
from router import create_app
from router._faces.serve import _watch

CONFIG = """upstreams: {{small: {{url: "http://127.0.0.1:9/v1"}}}}
policies:
  {name}: {{rules: [{{name: default, route: small}}]}}
"""
MTIME_NS = 1_700_000_000_000_000_000  # every version of the file gets this same mtime


class ConfigMapVolume:
    """A folder laid out as the kubelet lays out a ConfigMap volume (pkg/volume/util/atomic_writer.go):
    `router.yaml -> ..data/router.yaml`, `..data -> ..<timestamp>`; an update writes a new timestamped folder,
    points a temporary symlink at it, renames that over `..data` (atomic) and removes the old folder."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.version = 0
        self.file = root / "router.yaml"

    def publish(self, text: str) -> None:
        self.version += 1
        folder = self.root / f"..2026_12_01_00_00_{self.version:02d}.{1000 + self.version}"
        folder.mkdir()
        (folder / "router.yaml").write_text(text, encoding="utf-8")
        os.utime(folder / "router.yaml", ns=(MTIME_NS, MTIME_NS))
        data = self.root / "..data"
        old = os.readlink(data) if data.is_symlink() else None
        (self.root / "..data_tmp").symlink_to(folder.name)
        os.rename(self.root / "..data_tmp", data)
        if old is not None:
            for child in (self.root / old).iterdir():
                child.unlink()
            (self.root / old).rmdir()
        if not self.file.is_symlink():
            self.file.symlink_to(Path("..data") / "router.yaml")


async def _until(check: object, timeout_s: float = 10.0) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        if check():  # type: ignore[operator]
            return True
        await asyncio.sleep(0.02)
    return False


@pytest.mark.anyio
async def test_the_watcher_follows_the_kubelets_symlink_swap(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    volume = ConfigMapVolume(tmp_path)
    volume.publish(CONFIG.format(name="alpha"))
    app = create_app(load_config(volume.file))
    watcher = asyncio.create_task(_watch(app, 0.02))
    try:
        await asyncio.sleep(0.1)  # the watcher has taken its first stamp
        before = os.stat(volume.file)
        volume.publish(CONFIG.format(name="bravo"))  # same size, same mtime: only the symlink target differs
        after = os.stat(volume.file)
        assert (before.st_size, before.st_mtime_ns) == (after.st_size, after.st_mtime_ns)
        assert await _until(lambda: list(app.config.policies) == ["bravo"]), "the swapped ConfigMap was not reloaded"

        caplog.set_level(logging.ERROR, logger="router")
        volume.publish(CONFIG.format(name="charlie").replace("route: small", "route: nowhere"))
        assert await _until(lambda: "failed, keeping the running configuration" in caplog.text), "no reload tried"
        assert list(app.config.policies) == ["bravo"]  # the broken update keeps the running policies

        volume.publish(CONFIG.format(name="delta"))  # and a fixed one is picked up again
        assert await _until(lambda: list(app.config.policies) == ["delta"])
    finally:
        watcher.cancel()
        await app.aclose()
