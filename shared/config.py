"""INI configuration: one table of options, loaded once with precedence flag > env > file > default.

Each program (ARCA, the node) declares its options as a tuple of `Option` rows and turns the
resolved values into its own frozen dataclass. Errors name the file, the section and the key
(and the line, where the INI parser knows it), so a user can fix them without reading code.
"""

from __future__ import annotations

import configparser
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping


class ConfigError(ValueError):
    """A configuration value could not be read; the message names where it came from."""


def home_dir(env: Mapping[str, str]) -> Path:
    """The node's home: $REAME_HOME, else ~/.reame (models, caches, sessions, kernel verdicts)."""
    home = env.get("REAME_HOME")
    return Path(home).expanduser() if home else Path.home() / ".reame"


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected a boolean (true/false/yes/no/on/off/1/0), got {text!r}")


_PARSERS: dict[type, Callable[[str], Any]] = {
    str: lambda text: text.strip(),
    int: lambda text: int(text.strip()),
    float: lambda text: float(text.strip()),
    bool: parse_bool,
}


@dataclass(frozen=True, slots=True)
class Option:
    """One configuration key: where it lives, its type, its default and what it does."""

    section: str
    key: str
    type: type
    default: Any
    doc: str
    env: str | None = None
    choices: tuple[str, ...] | None = None

    @property
    def name(self) -> str:
        return f"{self.section}.{self.key}"

    def parse(self, text: str) -> Any:
        value = _PARSERS[self.type](text)
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"expected one of {', '.join(self.choices)}, got {text!r}")
        return value


def read_ini(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(
        comment_prefixes=("#", ";"), inline_comment_prefixes=("#", ";"), interpolation=None
    )
    try:
        with open(path, encoding="utf-8") as handle:
            parser.read_file(handle, source=str(path))
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except configparser.Error as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return parser


def resolve(
    table: Iterable[Option],
    *,
    file: Path | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Resolve every option of `table` to a value, keyed by 'section.key'.

    `flags` holds values already typed by the command line, keyed by 'section.key'; a value of
    None means the flag was not given. Unknown keys in the file are errors (typos must not be
    silently ignored).
    """
    options = list(table)
    env = os.environ if env is None else env
    flags = flags or {}
    parser = read_ini(file) if file is not None else None
    known = {(opt.section, opt.key) for opt in options}
    if parser is not None:
        for section in parser.sections():
            for key in parser[section]:
                if (section, key) not in known:
                    raise ConfigError(f"{file}: [{section}] {key}: unknown key")
    values: dict[str, Any] = {}
    for opt in options:
        flag_value = flags.get(opt.name)
        if flag_value is not None:
            values[opt.name] = flag_value
            continue
        if opt.env and opt.env in env:
            try:
                values[opt.name] = opt.parse(env[opt.env])
            except ValueError as exc:
                raise ConfigError(f"environment {opt.env} ({opt.name}): {exc}") from None
            continue
        if parser is not None and parser.has_option(opt.section, opt.key):
            try:
                values[opt.name] = opt.parse(parser.get(opt.section, opt.key))
            except ValueError as exc:
                raise ConfigError(f"{file}: [{opt.section}] {opt.key}: {exc}") from None
            continue
        values[opt.name] = opt.default
    return values


def render_ini(table: Iterable[Option], header: str) -> str:
    """The commented config file for a table: every key present, with its doc and default."""
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    current = None
    for opt in table:
        if opt.section != current:
            lines += ["", f"[{opt.section}]"]
            current = opt.section
        lines.append(f"# {opt.doc}")
        if opt.env:
            lines.append(f"# environment: {opt.env}")
        default = opt.default
        if isinstance(default, bool):
            default = "true" if default else "false"
        lines.append(f"{opt.key} = {'' if default is None else default}")
    return "\n".join(lines) + "\n"
