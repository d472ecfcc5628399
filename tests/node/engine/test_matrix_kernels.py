"""The CPU matrix kernels the node runs give the exact products of quantized weights and tokens.

ggml's matrix product of Q8_0, Q5_0 and Q4_0 weights by float columns (the columns quantized
to Q8_0 on the way, as every layer does it) is checked against numpy: weights and columns are
made of whole quants times fp16 scales, so the integer sums are exact and the float result may
differ from the float64 reference only by rounding. On a CPU with AVX-512 VNNI these products
run the patched kernel (deploy/llama_cpp/patches/0005-q0-lanes-avx512.patch, which replaced
0002-q0-pairs-avx512.patch's: a weight row to each lane of a tile of 16, every product of 1 to
512 columns whose packed columns fit in 1 MiB); on one with AVX2 and without it, products of 2
columns or more run 0004-q0-columns-avx2.patch's (a tile of 4 weight rows unpacked once and
swept over every column); elsewhere llama.cpp's own, which the same check holds for. The
shapes cover one column (a token's decode), odd counts (the last pair half empty), row counts
off the tile of 4 (the last thread's leftover rows), and sizes past the kernels' reach (more
than 512 columns, packed columns over 512 KiB or 1 MiB) where llama.cpp's tile takes over. A
wrong column, row, scale or offset gives a wrong number here, not a near miss.

A column's products are also the same to the bit whatever columns share the product (a token's
decode alone, or a row of a step of 2, 5, 17 or 64): speculation's verified rows are compared
with what plain decoding would have chosen, and every kernel here sums a column's products in
the same order whatever the columns beside it (the lanes kernel: a row's blocks in order, in one
lane; the AVX2 one: in the order of ggml's one-column dot product).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp", reason="node extra not installed")

F32, Q4_0, Q5_0, Q8_0 = 0, 2, 6, 8
QK = 32


class InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


def _libraries() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    lib = Path(llama_cpp.__file__).parent / "lib"
    base, cpu = lib / "libggml-base.so", lib / "libggml-cpu.so"
    if not base.exists() or not cpu.exists():
        pytest.skip(f"no ggml shared libraries in {lib}")
    base_lib, cpu_lib = ctypes.CDLL(str(base)), ctypes.CDLL(str(cpu))
    base_lib.ggml_init.argtypes = [InitParams]
    base_lib.ggml_init.restype = ctypes.c_void_p
    base_lib.ggml_free.argtypes = [ctypes.c_void_p]
    base_lib.ggml_new_tensor_2d.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    base_lib.ggml_new_tensor_2d.restype = ctypes.c_void_p
    base_lib.ggml_mul_mat.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    base_lib.ggml_mul_mat.restype = ctypes.c_void_p
    base_lib.ggml_new_graph.argtypes = [ctypes.c_void_p]
    base_lib.ggml_new_graph.restype = ctypes.c_void_p
    base_lib.ggml_build_forward_expand.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    base_lib.ggml_get_data.argtypes = [ctypes.c_void_p]
    base_lib.ggml_get_data.restype = ctypes.c_void_p
    base_lib.ggml_nbytes.argtypes = [ctypes.c_void_p]
    base_lib.ggml_nbytes.restype = ctypes.c_size_t
    cpu_lib.ggml_graph_compute_with_ctx.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    cpu_lib.ggml_graph_compute_with_ctx.restype = ctypes.c_int
    return base_lib, cpu_lib


def _weights(kind: int, rows: int, k: int, rng: np.random.Generator) -> tuple[bytes, np.ndarray]:
    """Random weight blocks in ggml's layout, and the values they stand for (float64)."""
    blocks = rows * (k // QK)
    scales = rng.integers(1, 64, blocks).astype(np.float16) / np.float16(1024)  # exact in fp16
    d = scales.view(np.uint8).reshape(blocks, 2)
    if kind == Q8_0:
        q = rng.integers(-127, 128, (blocks, QK)).astype(np.int8)
        raw = np.concatenate([d, q.view(np.uint8)], axis=1)
        values = q.astype(np.float64)
    else:
        bits = 4 if kind == Q4_0 else 5
        u = rng.integers(0, 1 << bits, (blocks, QK)).astype(np.uint8)
        qs = (u[:, :16] & 15) | ((u[:, 16:] & 15) << 4)
        parts = [d]
        if kind == Q5_0:
            high = (u >> 4).astype(np.uint32)
            qh = (high << np.arange(QK, dtype=np.uint32)).sum(axis=1, dtype=np.uint32)
            parts.append(qh.astype("<u4").view(np.uint8).reshape(blocks, 4))
        raw = np.concatenate([*parts, qs], axis=1)
        values = u.astype(np.float64) - (1 << (bits - 1))
    values = values * scales.astype(np.float64)[:, None]
    return raw.tobytes(), values.reshape(rows, k)


def _columns(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Columns that Q8_0 holds exactly: each block whole quants (one at +-127) times a power of two."""
    q = rng.integers(-127, 128, (n, k // QK, QK)).astype(np.float64)
    q[:, :, 0] = 127 * rng.choice([-1, 1], (n, k // QK))
    scale = 2.0 ** rng.integers(-8, -2, (n, k // QK, 1))
    return (q * scale).reshape(n, k)


def _product(kind: int, rows: int, k: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    base, cpu = _libraries()
    rng = np.random.default_rng(seed)
    raw, w = _weights(kind, rows, k, rng)
    x = _columns(n, k, rng)
    return _run(base, cpu, kind, raw, rows, k, x).astype(np.float64), x @ w.T


def _run(base: ctypes.CDLL, cpu: ctypes.CDLL, kind: int, raw: bytes, rows: int, k: int, x: np.ndarray) -> np.ndarray:
    """ggml's product of the weight blocks `raw` by the columns x (n by k) on 2 threads: n by rows, float32."""
    n = len(x)
    ctx = base.ggml_init(InitParams(len(raw) + x.size * 4 + rows * n * 4 + (64 << 20), None, False))
    assert ctx, "ggml_init failed"
    try:
        a = base.ggml_new_tensor_2d(ctx, kind, k, rows)
        b = base.ggml_new_tensor_2d(ctx, F32, k, n)
        assert base.ggml_nbytes(a) == len(raw)
        ctypes.memmove(base.ggml_get_data(a), raw, len(raw))
        columns = np.ascontiguousarray(x, dtype=np.float32)
        ctypes.memmove(base.ggml_get_data(b), columns.ctypes.data, columns.nbytes)
        out = base.ggml_mul_mat(ctx, a, b)
        graph = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(graph, out)
        assert cpu.ggml_graph_compute_with_ctx(ctx, graph, 2) == 0
        got = np.ctypeslib.as_array((ctypes.c_float * (rows * n)).from_address(base.ggml_get_data(out)))
        return got.reshape(n, rows).copy()
    finally:
        base.ggml_free(ctx)


@pytest.mark.parametrize("kind", [Q8_0, Q5_0, Q4_0], ids=["q8_0", "q5_0", "q4_0"])
@pytest.mark.parametrize("rows,k,n", [
    (4, 32, 1), (262, 640, 1), (262, 640, 2), (262, 640, 3), (261, 640, 5), (1003, 640, 17),
    (64, 2048, 64), (130, 640, 129), (130, 64, 512),
    (130, 64, 513),     # past 512 columns: llama.cpp's tile
    (40, 8192, 300),    # packed columns past 1 MiB: llama.cpp's tile
    (40, 8192, 60),     # packed columns past 512 KiB (the AVX2 kernel's reach): llama.cpp's tile
    (41, 8192, 56),     # within it
    (3, 640, 9),        # fewer rows than a tile
])
def test_quantized_products_are_exact_up_to_float_rounding(kind, rows, k, n):
    got, want = _product(kind, rows, k, n, seed=rows * 7919 + k * 31 + n)
    scale = np.abs(want).max() + 1e-30
    worst = np.abs(got - want).max() / scale
    assert worst < 1e-5, f"{rows}x{k} by {n} columns: worst error {worst:.2e} of the largest value"


@pytest.mark.parametrize("kind", [Q8_0, Q5_0, Q4_0], ids=["q8_0", "q5_0", "q4_0"])
def test_a_columns_products_do_not_depend_on_the_columns_beside_it(kind):
    """Each column of a 64-column product, and of its first 17, 5 and 2 columns, is bit for bit
    that column's product alone (one column: ggml's dot product)."""
    rows, k = 262, 640
    base, cpu = _libraries()
    rng = np.random.default_rng(kind)
    raw, _ = _weights(kind, rows, k, rng)
    x = _columns(64, k, rng)
    alone = np.stack([_run(base, cpu, kind, raw, rows, k, x[j:j + 1]) for j in range(17)])[:, 0]
    for n in (2, 5, 17, 64):
        together = _run(base, cpu, kind, raw, rows, k, x[:n])
        for j in range(min(n, 17)):
            assert together[j].tobytes() == alone[j].tobytes(), f"column {j} of {n}"
