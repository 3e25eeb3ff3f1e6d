"""Reading a keys file (`server.auth.keys_file`): `keys: [...]`, each entry as in `server.auth.keys`.

>>> keys = load_keys("/run/secrets/d3router-keys.yaml")      # doctest: +SKIP
"""

from __future__ import annotations

import os

from pydantic import ValidationError

from policies._access import ClientKeySpec, KeysFileSpec
from policies._errors import ConfigError, Issue
from policies._issues import by_line, from_pydantic
from policies._yaml import load_yaml

MAX_KEYS_FILE_BYTES = 4 * 1024 * 1024


def load_keys(path: str | os.PathLike[str]) -> tuple[ClientKeySpec, ...]:
    """The keys of the file at `path`; `ConfigError` naming the file (never a key) when it cannot be used."""
    file = os.fspath(path)
    try:
        with open(file, "rb") as handle:
            raw = handle.read(MAX_KEYS_FILE_BYTES + 1)
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([Issue(file, None, None, (), f"cannot read the keys file: {exc}")]) from None
    if len(raw) > MAX_KEYS_FILE_BYTES:
        raise ConfigError([Issue(file, None, None, (), "the keys file is over 4 MiB")])
    data, marks = load_yaml(text, file)
    try:
        spec = KeysFileSpec.model_validate(data if data is not None else {})
    except ValidationError as exc:
        issues = [
            Issue(i.file, i.line, i.column, i.path, i.message.split(", found")[0])  # a bad entry's value may be a key
            for i in from_pydantic(exc, marks, file)
        ]
        raise ConfigError(by_line(issues)) from None
    names = [key.name for key in spec.keys]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ConfigError([Issue(file, None, None, ("keys",), f"key names used twice: {', '.join(repeated)}")])
    return tuple(spec.keys)
