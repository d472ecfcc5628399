"""The model's weights in 2 MiB pages (node/engine/huge_pages.py).

The setting's resolution against the kernel's mode (a sysfs file written by the test), the
mappings a load creates found in /proc/self/maps, anonymous memory really moved into huge
pages (where this kernel offers them: it is the kernel's, not a fake's, answer), and a model
read into huge pages computing the logits the mapped one computes, bit for bit.
"""

from __future__ import annotations

import ctypes
import mmap
from pathlib import Path

import numpy as np
import pytest

from node.engine import huge_pages
from node.engine.config import EngineConfig
from node.engine.errors import InvalidRequest, ModelLoadError


def _mode_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "enabled"
    path.write_text(text)
    return path


def test_the_kernels_mode_is_the_bracketed_word(tmp_path):
    assert huge_pages.thp_mode(_mode_file(tmp_path, "always [madvise] never\n")) == "madvise"
    assert huge_pages.thp_mode(_mode_file(tmp_path, "[always] madvise never\n")) == "always"
    assert huge_pages.thp_mode(_mode_file(tmp_path, "always madvise [never]\n")) == "never"
    assert huge_pages.thp_mode(tmp_path / "absent") == ""


def test_auto_follows_the_kernel_and_on_refuses_where_it_offers_none(tmp_path):
    madvise = _mode_file(tmp_path, "always [madvise] never\n")
    assert huge_pages.wanted("auto", path=madvise) is True
    assert huge_pages.wanted("on", path=madvise) is True
    assert huge_pages.wanted("off", path=madvise) is False
    never = _mode_file(tmp_path, "always madvise [never]\n")
    assert huge_pages.wanted("auto", path=never) is False
    with pytest.raises(ModelLoadError, match="offers no transparent huge pages"):
        huge_pages.wanted("on", path=never)
    assert huge_pages.wanted("auto", path=tmp_path / "absent") is False
    with pytest.raises(ModelLoadError, match="huge_pages must be one of"):
        huge_pages.wanted("yes", path=madvise)


def test_auto_keeps_the_mapping_for_a_model_over_half_the_available_ram(tmp_path):
    madvise = _mode_file(tmp_path, "always [madvise] never\n")
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:        2048000 kB\nMemFree:          900000 kB\nMemAvailable:    1000000 kB\n")
    available = 1000000 * 1024
    assert huge_pages.available_ram(meminfo) == available
    assert huge_pages.wanted("auto", available // 2, madvise, meminfo) is True
    assert huge_pages.wanted("auto", available // 2 + 1, madvise, meminfo) is False
    assert huge_pages.wanted("on", available, madvise, meminfo) is True  # asked for: the user's call
    assert huge_pages.wanted("auto", available, madvise, tmp_path / "absent") is True  # nothing known


def test_the_huge_page_size_is_the_kernels(tmp_path):
    size = tmp_path / "hpage_pmd_size"
    size.write_text("536870912\n")  # an arm64 kernel with 64 KiB pages
    assert huge_pages.page_size(size) == 512 << 20
    size.write_text("junk\n")
    assert huge_pages.page_size(size) == huge_pages.HUGE
    assert huge_pages.page_size(tmp_path / "absent") == huge_pages.HUGE


def test_the_engine_config_refuses_an_unknown_setting():
    with pytest.raises(InvalidRequest, match="huge_pages must be auto, on or off"):
        EngineConfig(model_path=Path("m.gguf"), huge_pages="maybe").check()


def test_huge_bytes_counts_only_entries_inside_the_ranges(tmp_path):
    smaps = tmp_path / "smaps"
    smaps.write_text(
        "7f0000000000-7f0000800000 rw-p 00000000 00:00 0 \n"
        "Size:               8192 kB\nAnonHugePages:      6144 kB\n"
        "7f0000800000-7f0000a00000 rw-p 00000000 00:00 0 \n"
        "Size:               2048 kB\nAnonHugePages:      2048 kB\n"
        "7f1000000000-7f1000200000 r--p 00000000 fe:00 12 /lib/x.so\n"
        "Size:               2048 kB\nAnonHugePages:      2048 kB\n")
    inside = [(0x7F0000000000, 0x7F0000A00000)]
    assert huge_pages.huge_bytes(inside, smaps) == (6144 + 2048) * 1024
    assert huge_pages.huge_bytes([(0x7F0000000000, 0x7F0000800000)], smaps) == 6144 * 1024


def test_the_weights_mappings_are_told_from_the_loads_other_allocations():
    mib = 1 << 20
    weights = (0x7F0000000000, 0x7F0000000000 + 235 * mib + 4096)  # 235 MiB and glibc's header page
    repack = (0x7F1000000000, 0x7F1000000000 + 50 * mib + 4096)
    vocab = (0x7F2000000000, 0x7F2000000000 + 41 * mib)
    arena = (0x7F3000000000, 0x7F3000000000 + 300 * mib)
    new = {weights, repack, vocab, arena}
    assert huge_pages.holding(new, [235 * mib, 50 * mib]) == {weights, repack}
    assert huge_pages.holding(new, [235 * mib]) == {weights}
    assert huge_pages.holding({vocab, arena}, [235 * mib]) == set()  # nothing that size: nothing moved


def test_a_new_anonymous_mapping_is_found_and_collapsed():
    before = huge_pages.anonymous_mappings()
    size = 16 << 20
    area = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        area.write(b"\x01" * size)  # every page touched, as a model read into memory is
        start = ctypes.addressof(ctypes.c_char.from_buffer(area))
        new = huge_pages.anonymous_mappings() - before
        assert any(lo <= start and start + size <= hi for lo, hi in new), "the new mapping was not found"
        if not huge_pages.offered():
            pytest.skip(f"this kernel offers no transparent huge pages ({huge_pages.thp_mode() or 'none'})")
        done = huge_pages.collapse({(lo, hi) for lo, hi in new if lo <= start < hi})
        assert done.mapped >= size - 2 * huge_pages.page_size()  # aligned inward to whole huge pages
        if done.note == huge_pages.UNCOLLAPSED:
            pytest.skip(done.note)  # a kernel before 6.1: khugepaged's time, not the test's
        assert not done.note, done.note
        assert done.huge == done.mapped, done.describe()
        assert area[:4] == b"\x01" * 4 and area[size - 4:] == b"\x01" * 4  # the contents moved with them
    finally:
        area.close()


@pytest.mark.model
def test_weights_read_into_huge_pages_give_the_mapped_models_logits(gemma_path):
    from node.engine.llama import LlamaContext, LlamaModel, TokenBatch

    def logits(model: LlamaModel) -> np.ndarray:
        ctx = LlamaContext(model, n_ctx=256, n_batch=64, n_ubatch=64, n_seq_max=1, n_threads=2,
                           max_outputs_per_seq=8)
        try:
            batch = TokenBatch(64)
            tokens = model.tokenize("The harbour of Vellmar was built in the year of the long winter")
            batch.add(tokens[:-6], 0, 0, logits="last")
            assert ctx.decode(batch) == 0
            batch.clear()
            batch.add(tokens[-6:], len(tokens) - 6, 0, logits="all")
            assert ctx.decode(batch) == 0
            return np.array(ctx.logits(6), copy=True)
        finally:
            ctx.close()

    mapped = LlamaModel(gemma_path, extra_buffers=False)
    try:
        assert mapped.collapsed is None and "CPU_Mapped" in mapped.buffers
        expected = logits(mapped)
    finally:
        mapped.close()
    if not huge_pages.offered():
        pytest.skip("this kernel offers no transparent huge pages")
    huge = LlamaModel(gemma_path, extra_buffers=False, huge_pages=True)
    try:
        assert huge.collapsed is not None and "CPU_Mapped" not in huge.buffers  # read, not mapped
        weights = sum(huge.buffers.values()) * 2**20
        # the weights' own mapping, not the load's other allocations (it rounds to whole huge pages)
        assert 0.95 * weights <= huge.collapsed.huge <= weights + 2 * huge_pages.page_size(), huge.collapsed.describe()
        assert np.array_equal(logits(huge), expected)
    finally:
        huge.close()
