"""ARCA's option table: the shipped conf/arca.conf, precedence, validation, protected mode."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from arca.config import HEADER, OPTIONS, load_config
from arca.daemon import config_from_argv, protected_mode_refusal
from shared.config import ConfigError, render_ini

CONF = Path(__file__).resolve().parents[2] / "conf" / "arca.conf"


def test_shipped_conf_matches_the_option_table():
    assert CONF.read_text() == render_ini(OPTIONS, HEADER)


def test_shipped_conf_loads_to_the_defaults():
    assert load_config(file=CONF, env={}) == replace(load_config(env={}), config_file=CONF)


def test_defaults_are_finite_and_loopback():
    config = load_config(env={})
    assert config.host == "127.0.0.1" and config.port == 6420
    assert 0 < config.max_mb < 100_000 and config.durability == "commit"
    assert config.requirepass is None and config.protected_mode
    assert config.limits.max_bulk_len == 64 * 1024 * 1024


@pytest.fixture(autouse=True)
def no_password_in_environment(monkeypatch):
    monkeypatch.delenv("REAME_ARCA_PASSWORD", raising=False)


def test_precedence_flag_env_file(tmp_path):
    conf = tmp_path / "arca.conf"
    conf.write_text("[server]\nport = 7000\nrequirepass = from-file\n[storage]\nmax-mb = 10\n")
    config = load_config(file=conf, env={"REAME_ARCA_PASSWORD": "from-env"})
    assert config.port == 7000 and config.max_mb == 10 and config.requirepass == "from-env"
    config = config_from_argv(["--config", str(conf), "--port", "7001", "--requirepass", "flag"])
    assert config.port == 7001 and config.requirepass == "flag" and config.max_mb == 10


@pytest.mark.parametrize(
    "text, message",
    [
        ("[server]\nport = 70000\n", "port"),
        ("[server]\nprot = 1\n", "unknown key"),
        ("[storage]\ndurability = sometimes\n", "durability"),
        ("[storage]\nmax-mb = 0\n", "max-mb"),
        ("[limits]\nclient-query-buffer-limit = 10\n", "client-query-buffer-limit"),
    ],
)
def test_bad_values_name_the_key(tmp_path, text, message):
    conf = tmp_path / "arca.conf"
    conf.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(file=conf, env={})


def test_protected_mode():
    assert protected_mode_refusal(config_from_argv([])) is None
    assert protected_mode_refusal(config_from_argv(["--host", "::1"])) is None
    refusal = protected_mode_refusal(config_from_argv(["--host", "0.0.0.0"]))
    assert refusal and "password" in refusal and "--protected-mode no" in refusal
    assert protected_mode_refusal(config_from_argv(["--host", "0.0.0.0", "--requirepass", "x"])) is None
    assert protected_mode_refusal(config_from_argv(["--host", "0.0.0.0", "--protected-mode", "no"])) is None
