"""Autoconfiguration on the real Gemma GGUF: threads, slots, context and KV type from the host."""

from __future__ import annotations

import pytest

from node.config import load_settings
from node.models.ggufmeta import GGUFError, read_metadata, summarize
from node.models.loader import auto_threads, plan_engine
from node.models.errors import ModelError

GIB = 1 << 30


def settings_for(model, home, **flags):
    return load_settings(None, {"model.path": str(model), **flags}, env={"REAME_HOME": str(home)})


@pytest.mark.parametrize("cores, threads", [(1, 1), (2, 2), (4, 4), (5, 4), (16, 15)])
def test_threads_leave_a_core_above_four(cores, threads):
    assert auto_threads(cores) == threads


def test_gguf_header_of_the_real_model(gemma_path):
    summary = summarize(gemma_path)
    assert summary.architecture == "gemma3"
    assert summary.n_ctx_train == 32768 and summary.n_layer == 18
    assert summary.chat_template is None  # the base model ships none: built-in Gemma template
    assert summary.kv_bytes_per_token("q8_0") < summary.kv_bytes_per_token("f16")
    assert read_metadata(gemma_path)["tokenizer.ggml.bos_token_id"] == 2


def test_not_a_gguf_is_a_clear_error(tmp_path):
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"not a model at all")
    with pytest.raises(GGUFError, match="not a GGUF"):
        summarize(fake)
    with pytest.raises(ModelError, match="not a GGUF"):
        plan_engine(settings_for(fake, tmp_path))


def test_auto_plan_with_plenty_of_ram(gemma_path, tmp_path):
    plan = plan_engine(settings_for(gemma_path, tmp_path), cores=2, ram_bytes=16 * GIB)
    assert plan.model.entry.alias == "gemma3-270m"  # a path to a catalog file keeps its defaults
    assert (plan.n_threads, plan.n_parallel) == (2, 4)
    assert plan.n_ctx == 4096 * 4
    assert plan.kv_type == "f16"
    assert plan.notes


def test_little_ram_picks_a_smaller_kv_type_then_a_smaller_context(gemma_path, tmp_path):
    size = gemma_path.stat().st_size
    f16_bytes = summarize(gemma_path).kv_bytes_per_token("f16") * 4096 * 4
    tight = plan_engine(settings_for(gemma_path, tmp_path), ram_bytes=size + 2 * f16_bytes - 2)
    assert tight.kv_type == "q8_0" and tight.n_ctx == 4096 * 4
    starved = plan_engine(settings_for(gemma_path, tmp_path), ram_bytes=size + 64 * (1 << 20))
    assert starved.kv_type == "q4_0" and starved.n_ctx < 4096 * 4
    assert starved.kv_bytes <= 32 * (1 << 20)


def test_explicit_settings_win(gemma_path, tmp_path):
    settings = settings_for(gemma_path, tmp_path, **{
        "model.threads": 1, "model.context_length": 1024, "server.parallel": 2,
        "memory.kv_cache_type": "q8_0", "model.batch": 256, "model.ubatch": 512,
    })
    plan = plan_engine(settings, ram_bytes=16 * GIB)
    assert (plan.n_threads, plan.n_ctx, plan.n_parallel, plan.kv_type) == (1, 1024, 2, "q8_0")
    assert (plan.n_batch, plan.n_ubatch) == (256, 256)
