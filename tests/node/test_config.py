"""Node settings: precedence flag > env > file > default, typed values, errors naming their source."""

from __future__ import annotations

from pathlib import Path

import pytest

from node.config import OPTIONS, default_config_text, load_settings
from shared.config import ConfigError

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "reame.conf"
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_without_file(tmp_path):
    settings = load_settings(None, {}, env={"REAME_HOME": str(tmp_path)})
    assert settings.model.path == "gemma3-270m"
    assert settings.server.host == "127.0.0.1" and settings.server.port == 8080
    assert settings.server.api_key is None and settings.arca.remote is None
    assert settings.memory.kv_cache_type == "auto"
    assert settings.home == tmp_path
    assert settings.cache.directory == tmp_path / "cache"
    assert settings.arca.directory == tmp_path / "arca"


@pytest.mark.parametrize(
    "file_value, env_value, flag_value, expected",
    [
        (None, None, None, 8080),
        ("9001", None, None, 9001),
        ("9001", "9002", None, 9002),
        ("9001", "9002", 9003, 9003),
        (None, None, 9003, 9003),
    ],
)
def test_precedence_flag_env_file_default(tmp_path, file_value, env_value, flag_value, expected):
    conf = write(tmp_path, f"[server]\nport = {file_value}\n" if file_value else "[server]\n")
    env = {"REAME_SERVER_PORT": env_value} if env_value else {}
    settings = load_settings(conf, {"server.port": flag_value}, env=env)
    assert settings.server.port == expected


def test_file_values_are_typed(tmp_path):
    conf = write(tmp_path, """
[model]
path = /models/x.gguf   # inline comment
threads = 3
[memory]
use_mmap = no
kv_cache_type = q8_0
[arca]
remote = 10.0.0.5:6420
[cache]
directory = ~/kv
""")
    settings = load_settings(conf, {}, env={})
    assert settings.model.path == "/models/x.gguf"
    assert settings.model.threads == 3
    assert settings.memory.use_mmap is False
    assert settings.memory.kv_cache_type == "q8_0"
    assert settings.arca.remote_address == ("10.0.0.5", 6420)
    assert settings.cache.directory == Path("~/kv").expanduser()
    assert settings.config_file == conf


@pytest.mark.parametrize(
    "text, fragments",
    [
        ("[server]\nport = eighty\n", ["reame.conf", "[server] port", "invalid literal"]),
        ("[memory]\nkv_cache_type = q2\n", ["[memory] kv_cache_type", "f16, q8_0, q4_0"]),
        ("[server]\nprot = 1\n", ["[server] prot", "unknown key"]),
        ("[server]\nport = 70000\n", ["[server] port", "0-65535"]),
        ("[arca]\nremote = nohost\n", ["[arca] remote", "host:port"]),
        ("[arca]\nremote = http://box:1\n", ["[arca] remote", "unknown scheme", "redis+cluster://"]),
        ("[arca]\nkv_remote = redis://a:1,b:2\n", ["[arca] kv_remote", "cluster URL"]),
        ("[model]\nthreads = -2\n", ["[model] threads", ">= -1"]),
        ("[model\npath = x\n", ["reame.conf"]),
    ],
)
def test_errors_name_file_section_and_key(tmp_path, text, fragments):
    conf = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_settings(conf, {}, env={})
    for fragment in fragments:
        assert fragment in str(caught.value)


def test_remote_urls(tmp_path):
    settings = load_settings(None, {"arca.remote": "rediss+cluster://u:p@10.0.0.7:7000,10.0.0.8:7000"}, env={})
    assert settings.arca.remote_address == ("10.0.0.7", 7000)


def test_env_errors_name_the_variable(tmp_path):
    with pytest.raises(ConfigError, match="REAME_MEMORY_USE_MLOCK"):
        load_settings(None, {}, env={"REAME_MEMORY_USE_MLOCK": "maybe"})
    with pytest.raises(ConfigError, match="REAME_SERVER_PORT"):
        load_settings(None, {}, env={"REAME_SERVER_PORT": "-5"})


def test_flag_errors_name_the_option():
    with pytest.raises(ConfigError, match=r"command line \(server.parallel\)"):
        load_settings(None, {"server.parallel": -2}, env={})


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "absent.conf", {}, env={})


def test_shipped_conf_matches_the_table():
    shipped = (REPO / "conf" / "reame.conf").read_text(encoding="utf-8")
    assert shipped == default_config_text(), "regenerate: python -m node.config > conf/reame.conf"


def test_shipped_conf_loads_to_the_defaults(tmp_path):
    from_file = load_settings(REPO / "conf" / "reame.conf", {}, env={"REAME_HOME": str(tmp_path)})
    defaults = load_settings(None, {}, env={"REAME_HOME": str(tmp_path)})
    assert from_file.model == defaults.model and from_file.server == defaults.server
    assert from_file.arca == defaults.arca and from_file.cache == defaults.cache


def test_every_original_key_is_present():
    keys = {opt.name for opt in OPTIONS}
    original = {
        "model.path", "model.context_length", "model.threads", "model.ubatch",
        "memory.use_mmap", "memory.use_mlock", "memory.kv_cache_type",
        "cache.directory", "cache.max_size_mb", "cache.compress",
        "cache.block_tokens", "server.host", "server.port", "server.max_concurrent_requests",
        "server.max_request_size_mb", "server.enable_cors", "server.enable_metrics",
        "server.api_key", "server.model_id", "server.parallel", "arca.remote",
    }
    assert original <= keys


def test_speculative_settings_resolve_and_refuse_what_is_not_there(tmp_path):
    env = {"REAME_HOME": str(tmp_path)}
    spec = load_settings(None, {}, env=env).speculative
    assert spec.enabled and spec.sources == ("lookup", "archive", "format") and spec.max_draft == 16
    assert load_settings(None, {"speculative.sources": " archive , lookup,archive"}, env=env).speculative.sources \
        == ("archive", "lookup")
    with_model = load_settings(None, {"speculative.sources": "lookup,model", "speculative.draft_model_path": "/m.gguf"},
                               env=env).speculative
    assert with_model.sources == ("lookup", "model") and str(with_model.draft_model_path) == "/m.gguf"
    for flags, words in (({"speculative.sources": "lookup,model"}, ["speculative.draft_model_path", "needs both"]),
                         ({"speculative.draft_model_path": "/m.gguf"}, ["speculative.sources", "needs both"]),
                         ({"speculative.sources": "ngram"}, ["unknown source 'ngram'"]),
                         ({"speculative.min_draft": 9, "speculative.max_draft": 4}, ["min_draft", "<= "])):
        with pytest.raises(ConfigError) as info:
            load_settings(None, flags, env=env)
        assert all(word in str(info.value) for word in words), str(info.value)


def test_every_key_is_documented():
    doc = (REPO / "docs" / "CONFIG.md").read_text(encoding="utf-8")
    for opt in OPTIONS:
        assert f"| `{opt.key}` |" in doc and f"`{opt.env}`" in doc, opt.name


def test_api_keys_add_to_the_single_key_from_file_env_and_flag(tmp_path):
    env = {"REAME_HOME": str(tmp_path)}
    settings = load_settings(write(tmp_path, "[server]\napi_key = one\napi_keys = two, three,,one\n"), {}, env=env)
    assert settings.server.api_key == "one" and settings.server.keys == ("one", "two", "three")
    assert load_settings(None, {}, env={**env, "REAME_SERVER_API_KEYS": "x,y"}).server.keys == ("x", "y")
    assert load_settings(None, {}, env=env).server.keys == ()  # no key: one open tenant

    from node.cli.commands import build_parser, settings_from_args

    args = build_parser("reame", model_positional=False).parse_args(["--serve", "--api-keys", "p,q", "--api-key", "k"])
    assert settings_from_args(args).server.keys == ("k", "p", "q")


def test_reame_warm_prefills_for_every_configured_key_or_the_one_asked(tmp_path):
    """A keyed node restores only its keys' states: `reame warm` warms for each key of the
    config (a document warmed for the keyless tenant would never be restored there)."""
    from node.cli.commands import warm_tenants
    from node.serving.tenants import OPEN, tenant_id

    env = {"REAME_HOME": str(tmp_path)}
    keyed = load_settings(None, {"server.api_key": "k1", "server.api_keys": "k2"}, env=env)
    assert warm_tenants(keyed, None) == (tenant_id("k1"), tenant_id("k2"))
    assert warm_tenants(keyed, "k3") == (tenant_id("k3"),)
    assert warm_tenants(load_settings(None, {}, env=env), None) == (OPEN,)
