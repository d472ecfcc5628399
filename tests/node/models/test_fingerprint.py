"""Model fingerprints: content hashes, cached beside the file, renewed when the file changes."""

from __future__ import annotations

import hashlib
import json
import os

from node.models.fingerprint import cache_path, model_fingerprint, remember


def test_fingerprint_is_the_content_sha256_and_is_cached(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"x" * 10_000)
    expected = hashlib.sha256(model.read_bytes()).hexdigest()
    assert model_fingerprint(model) == expected
    record = json.loads(cache_path(model).read_text())
    assert record["sha256"] == expected and record["size"] == model.stat().st_size


def test_the_cache_is_used_while_path_size_and_mtime_match(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"one")
    model_fingerprint(model)
    record = json.loads(cache_path(model).read_text())
    record["sha256"] = "ab" * 32  # proves the cached value is what gets returned
    cache_path(model).write_text(json.dumps(record))
    assert model_fingerprint(model) == "ab" * 32


def test_a_replaced_file_gets_a_new_fingerprint(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"first model")
    first = model_fingerprint(model)
    stat = model.stat()
    model.write_bytes(b"other model")  # same size
    os.utime(model, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    second = model_fingerprint(model)
    assert second != first and second == hashlib.sha256(b"other model").hexdigest()


def test_same_content_same_fingerprint_whatever_the_path(tmp_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    a.write_bytes(b"same")
    b.write_bytes(b"same")
    assert model_fingerprint(a) == model_fingerprint(b)


def test_a_moved_cache_file_is_not_trusted(tmp_path):
    a = tmp_path / "a.gguf"
    a.write_bytes(b"content a")
    remember(a, "cd" * 32)
    b = tmp_path / "b.gguf"
    a.rename(b)
    cache_path(a).rename(cache_path(b))
    assert model_fingerprint(b) == hashlib.sha256(b"content a").hexdigest()


def test_corrupt_cache_and_read_only_directory(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"data")
    cache_path(model).write_text("{not json")
    assert model_fingerprint(model) == hashlib.sha256(b"data").hexdigest()
    blocked = tmp_path / "blocked.gguf"
    blocked.write_bytes(b"data")
    cache_path(blocked).mkdir()  # the cache cannot be read or written there
    assert model_fingerprint(blocked) == hashlib.sha256(b"data").hexdigest()
    assert cache_path(blocked).is_dir()
