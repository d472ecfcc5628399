"""The model catalog: alias matching, paths, the model store and the offline Gemma model."""

from __future__ import annotations

import pytest

from node.models.catalog import (
    CATALOG, DEFAULT_MODEL, AmbiguousModel, ModelUnavailable, UnknownModel, find_entry,
    local_models, on_disk, resolve_model,
)


def test_catalog_has_the_promised_aliases_with_real_sources():
    aliases = {entry.alias for entry in CATALOG}
    assert aliases == {"gemma3-270m", "tinyllama", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b",
                       "qwen2.5-coder-1.5b", "olmoe"}
    assert DEFAULT_MODEL in aliases
    for entry in CATALOG:
        assert entry.filename.endswith(".gguf") and entry.size_mb > 0 and entry.context >= 2048
        if entry.alias != DEFAULT_MODEL:
            assert entry.url.startswith("https://huggingface.co/") and entry.url.endswith(entry.filename)


@pytest.mark.parametrize(
    "name, alias",
    [("gemma3-270m", "gemma3-270m"), ("GEMMA", "gemma3-270m"), ("tiny", "tinyllama"),
     ("qwen2.5-3", "qwen2.5-3b"), ("Qwen2.5-Coder", "qwen2.5-coder-1.5b"), ("olmoe", "olmoe"),
     ("qwen2.5-1.5b", "qwen2.5-1.5b")],
)
def test_alias_exact_or_unambiguous_prefix(name, alias):
    assert find_entry(name).alias == alias


def test_ambiguous_prefix_lists_the_candidates():
    with pytest.raises(AmbiguousModel) as caught:
        find_entry("qwen")
    message = str(caught.value)
    for alias in ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-coder-1.5b"):
        assert alias in message


def test_unknown_name_points_to_reame_list():
    with pytest.raises(UnknownModel, match="reame list"):
        find_entry("llama-9000")


def test_a_path_to_any_gguf_works(tmp_path):
    model = tmp_path / "my-model.gguf"
    model.write_bytes(b"GGUF")
    resolved = resolve_model(str(model), tmp_path / "home")
    assert resolved.path == model and resolved.entry is None and resolved.alias == "my-model"
    with pytest.raises(ModelUnavailable, match="does not exist"):
        resolve_model(str(tmp_path / "missing.gguf"), tmp_path / "home")


def test_store_listing_and_no_fetch(tmp_path):
    home = tmp_path / "home"
    assert on_disk(home) == {} and local_models(home) == []
    with pytest.raises(ModelUnavailable, match="not on disk"):
        resolve_model("tinyllama", home, fetch=False)
    entry = find_entry("tinyllama")
    entry.path(home).parent.mkdir(parents=True)
    entry.path(home).write_bytes(b"GGUF")
    (home / "models" / "other.gguf").write_bytes(b"GGUF")
    assert on_disk(home) == {"tinyllama": entry.path(home)}
    assert [p.name for p in local_models(home)] == ["other.gguf", entry.filename]
    assert resolve_model("TinyLlama", home).entry is entry


def test_offline_default_is_assembled_from_its_package(tmp_path, gemma_path):
    """gemma3-270m resolves in an empty home by assembling the GGUF from the PyPI packages."""
    resolved = resolve_model(DEFAULT_MODEL, tmp_path)
    assert resolved.path == tmp_path / "models" / "gemma-3-270m-q4_k_m.gguf"
    assert resolved.path.stat().st_size == gemma_path.stat().st_size
    assert resolved.path.read_bytes()[:4] == b"GGUF"
    assert not list((tmp_path / "models").glob("*.part"))


def test_assembled_model_has_its_fingerprint_cached(tmp_path, gemma_path):
    from node.models.fingerprint import cache_path, hash_file, model_fingerprint

    resolved = resolve_model(DEFAULT_MODEL, tmp_path)
    assert cache_path(resolved.path).exists()
    assert model_fingerprint(resolved.path) == hash_file(gemma_path)


def test_nodes_sharing_a_model_store_assemble_at_once(tmp_path, monkeypatch):
    """Two first runs on one model store (a fleet's shared volume) write separate partial files
    and both end with the whole model; no partial file is left behind."""
    import sys
    import threading
    import types

    partials: list[str] = []
    both_writing = threading.Barrier(2, timeout=10)

    def assemble(path, overwrite=False):
        partials.append(path.name)
        with open(path, "wb") as out:
            out.write(b"GGUF")
            both_writing.wait()  # the two writers overlap
            out.write(b"\0" * 1000)

    package = types.ModuleType("fake_gemma_package")
    package.assemble = assemble  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_gemma_package", package)
    monkeypatch.setattr("node.models.catalog.GEMMA_PACKAGE", "fake_gemma_package")
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(resolve_model(DEFAULT_MODEL, tmp_path).path))
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(partials)) == 2 and len(results) == 2
    assert results[0].read_bytes() == b"GGUF" + b"\0" * 1000
    assert not list((tmp_path / "models").glob("*.part"))
