"""Downloads against a real aiohttp file server on 127.0.0.1 that honours HTTP Range."""

from __future__ import annotations

import hashlib
import os

import pytest
from aiohttp import web

from node.models.download import DownloadError, download, download_file, part_path
from node.models.fingerprint import cache_path
from tests.conftest import free_port

PAYLOAD = os.urandom(3 * 1024 * 1024 + 12_345)
DIGEST = hashlib.sha256(PAYLOAD).hexdigest()


@pytest.fixture
async def server(tmp_path):
    """Serves PAYLOAD at /model.gguf (Range via FileResponse) and /cut.gguf, whose first
    full-length answer stops after a third of the body and closes the connection."""
    source = tmp_path / "served.gguf"
    source.write_bytes(PAYLOAD)
    seen: list[str | None] = []

    async def model(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("Range"))
        return web.FileResponse(source)

    async def cut(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("Range"))
        if request.headers.get("Range"):
            return web.FileResponse(source)
        response = web.StreamResponse(headers={"Content-Length": str(len(PAYLOAD))})
        await response.prepare(request)
        await response.write(PAYLOAD[: len(PAYLOAD) // 3])
        request.transport.close()
        return response

    app = web.Application()
    app.router.add_get("/model.gguf", model)
    app.router.add_get("/cut.gguf", cut)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}", seen
    await runner.cleanup()


async def test_full_download_verifies_and_renames(server, tmp_path):
    base, seen = server
    dest = tmp_path / "models" / "m.gguf"
    await download(f"{base}/model.gguf", dest, sha256=DIGEST, progress=False)
    assert dest.read_bytes() == PAYLOAD
    assert not part_path(dest).exists()
    assert seen == [None]
    assert DIGEST in cache_path(dest).read_text()  # fingerprint recorded from the stream hash


async def test_resume_after_a_cut_connection(server, tmp_path):
    base, seen = server
    dest = tmp_path / "m.gguf"
    await download(f"{base}/cut.gguf", dest, sha256=DIGEST, progress=False, retry_delay_s=0)
    assert dest.read_bytes() == PAYLOAD
    assert seen[0] is None
    assert seen[1].startswith("bytes=") and seen[1] != "bytes=0-"
    assert int(seen[1][6:-1]) > 0  # resumed from the received length, not from zero


async def test_resume_from_an_existing_part_file(server, tmp_path):
    base, seen = server
    dest = tmp_path / "m.gguf"
    part_path(dest).write_bytes(PAYLOAD[:1_000_000])
    await download(f"{base}/model.gguf", dest, sha256=DIGEST, progress=False)
    assert seen == ["bytes=1000000-"]
    assert dest.read_bytes() == PAYLOAD


async def test_sha256_mismatch_deletes_the_partial_file(server, tmp_path):
    base, _ = server
    dest = tmp_path / "m.gguf"
    with pytest.raises(DownloadError, match="corrupt"):
        await download(f"{base}/model.gguf", dest, sha256="0" * 64, progress=False)
    assert not dest.exists() and not part_path(dest).exists()


async def test_http_error_is_reported(server, tmp_path):
    base, _ = server
    with pytest.raises(DownloadError, match="HTTP 404"):
        await download(f"{base}/absent.gguf", tmp_path / "m.gguf", progress=False)


def test_no_network_says_where_to_put_the_file(tmp_path):
    dest = tmp_path / "models" / "m.gguf"
    closed = f"http://127.0.0.1:{free_port()}/m.gguf"  # nothing listens there
    with pytest.raises(DownloadError) as caught:
        download_file(closed, dest, progress=False)
    assert f"put the file at {dest}" in str(caught.value)
    assert not dest.exists()


async def test_blocking_form_works_inside_a_running_loop(tmp_path):
    dest = tmp_path / "m.gguf"
    with pytest.raises(DownloadError, match="put the file at"):
        download_file(f"http://127.0.0.1:{free_port()}/m.gguf", dest, progress=False)


async def test_giving_up_keeps_the_part_file_for_the_next_run(server, tmp_path):
    base, _ = server
    dest = tmp_path / "m.gguf"
    with pytest.raises(DownloadError, match="run again to resume"):
        await download(f"{base}/cut.gguf", dest, progress=False, attempts=1)
    assert part_path(dest).read_bytes() == PAYLOAD[: len(PAYLOAD) // 3]
    await download(f"{base}/cut.gguf", dest, sha256=DIGEST, progress=False)
    assert dest.read_bytes() == PAYLOAD
