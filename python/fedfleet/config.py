"""fedfleet.Config: a run's configuration, every key of the TOML file, checked by fedfleet's own
C++ parser (the messages are the ones `fedfleet sim --set ...` prints)."""
from __future__ import annotations

import json
import math
import os
from typing import Any, Dict, Iterator, List, Optional

from . import _core
from ._core import ConfigError


def _toml_value(value: Any) -> str:
    """A Python value as a TOML literal, for Config.set."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, (str, os.PathLike)):
        # A JSON string is a TOML basic string (the same escapes).
        return json.dumps(os.fspath(value))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise ConfigError(f"{type(value).__name__} is not a configuration value (give a bool, "
                      "number, string or list)")


def absolute_path(path: Any) -> Optional[str]:
    """A path given as str or os.PathLike, made absolute; None stays None."""
    return None if path is None else os.path.abspath(os.fspath(path))


class Config:
    """Every key of a fedfleet TOML file, as `fedfleet sim --config FILE --set KEY=VALUE` reads
    them: unknown keys, wrong types and bad values raise fedfleet.ConfigError with fedfleet's
    own message.

        cfg = fedfleet.Config("examples/configs/sim.toml", rounds=30, **{"train.lr": 0.05})
        cfg["coordinator.clients_per_round"] = 20
        cfg.save("my.toml")                       # fedfleet sim --config my.toml runs the same

    Keyword arguments take a full key ("train.lr", through **{...}) or a bare key name that
    exactly one section has ("rounds" is run.rounds); an ambiguous bare name raises and lists
    the full keys it could mean.
    """

    def __init__(self, path: Optional[os.PathLike | str] = None, /, **values: Any):
        self._c = _core.Config()
        if path is not None:
            self._c.load_file(os.fspath(path))
        self.update(values)

    @classmethod
    def load(cls, path: os.PathLike | str) -> "Config":
        """Reads a TOML file (`fedfleet sim --config PATH`)."""
        return cls(path)

    @classmethod
    def from_toml(cls, text: str) -> "Config":
        """Reads TOML text."""
        cfg = cls()
        cfg._c.load_string(text, "<toml>")
        return cfg

    @classmethod
    def _from_core(cls, core: "_core.Config") -> "Config":
        cfg = cls.__new__(cls)
        cfg._c = core
        return cfg

    def save(self, path: os.PathLike | str) -> None:
        """Writes every key as a TOML file that `fedfleet ... --config PATH` reads."""
        text = self._c.to_toml()
        tmp = os.fspath(path) + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)

    def to_toml(self) -> str:
        return self._c.to_toml()

    def to_dict(self) -> Dict[str, Dict[str, Any]]:
        """Every key, as {section: {key: value}} (the form a history stores)."""
        return json.loads(self._c.to_json())

    def copy(self) -> "Config":
        return Config._from_core(self._c.copy())

    def validate(self) -> "Config":
        """Checks ranges and cross-field rules as a run does before it starts; returns self."""
        self._c.validate()
        return self

    @staticmethod
    def keys() -> List[str]:
        """Every "section.key", in order."""
        return _core.Config.keys()

    def resolve(self, name: str) -> str:
        """The full key a keyword argument names ("rounds" -> "run.rounds")."""
        if "." in name:
            return name
        matches = [k for k in _core.Config.keys() if k.split(".", 1)[1] == name]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise ConfigError(f"{name}: no such configuration key (Config.keys() lists them)")
        raise ConfigError(f"{name}: ambiguous, give one of {', '.join(matches)}")

    def update(self, values: Dict[str, Any]) -> "Config":
        """Sets several keys; returns self."""
        for key, value in values.items():
            self[key] = value
        return self

    def update_given(self, values: Dict[str, Any]) -> "Config":
        """Sets the keys whose value is not None (arguments a caller left out are None);
        returns self."""
        return self.update({k: v for k, v in values.items() if v is not None})

    def __setitem__(self, key: str, value: Any) -> None:
        self._c.set(f"{self.resolve(key)}={_toml_value(value)}")

    def __getitem__(self, key: str) -> Any:
        full = self.resolve(key)
        section, name = full.split(".", 1)
        values = self.to_dict()
        if section not in values or name not in values[section]:
            raise KeyError(full)
        return values[section][name]

    def __contains__(self, key: str) -> bool:
        try:
            return self.resolve(key) in _core.Config.keys()
        except ConfigError:
            return False

    def __iter__(self) -> Iterator[str]:
        return iter(_core.Config.keys())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        d = self.to_dict()
        default = Config().to_dict()
        changed = [f"{s}.{k}={v!r}" for s, keys in d.items() for k, v in keys.items()
                   if default.get(s, {}).get(k) != v]
        return f"fedfleet.Config({', '.join(changed)})"
