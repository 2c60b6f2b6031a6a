"""A model's config.json, decoded once and read through typed accessors.

Stdlib only (this module may run on the host). JSON's values are `object` until an accessor says what it
expects: a key that is absent or null reads as None; a key holding another kind of value than the one asked
for is bad input (ValueError naming the key), except `sub`, which reads anything but an object as absent,
as SGLang's own isinstance checks do.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    """One JSON object of config.json (the whole file, or a sub-config such as text_config)."""

    data: Mapping[str, object]
    where: str = "config.json"  # the file, named in the errors
    prefix: str = ""  # the path of this object in it ("text_config.")
    # the paths --json-model-override-args gave (with_override): a bad value there is the override's
    overridden: frozenset[str] = frozenset()

    def written_in(self, path: str) -> str:
        """Where the value at `path` (from the top: "rope_scaling.factor") was written, for an error: the
        file, or the override that gave it or an object above it."""
        given = any(path == p or path.startswith(p + ".") for p in self.overridden)
        return "--json-model-override-args" if given else self.where

    def _at(self, key: str) -> str:
        path = f"{self.prefix}{key}"
        return f"{self.written_in(path)}: {path}"

    @classmethod
    def of(cls, config: ModelConfig | Mapping[str, object], where: str = "config.json") -> ModelConfig:
        """The decoded JSON object as a ModelConfig (a ModelConfig as it is)."""
        if isinstance(config, ModelConfig):
            return config
        if not isinstance(config, Mapping):
            raise ValueError(f"{where} is not a JSON object")
        return cls(config, where)

    def has(self, key: str) -> bool:
        """The key is in the object, whatever it holds (null included)."""
        return key in self.data

    def value(self, key: str, default: object = None) -> object:
        """The value as decoded (`default` when absent), for truth tests and comparisons."""
        return self.data.get(key, default)

    def first(self, *keys: str) -> object:
        """The first of `keys` that holds a value other than null, else None."""
        return next((self.data[k] for k in keys if self.data.get(k) is not None), None)

    def number(self, key: str) -> int | float | None:
        """A JSON number as decoded (int or float), None when absent or null."""
        value = self.data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{self._at(key)} = {value!r} is not a number")
        if not math.isfinite(value):
            raise ValueError(f"{self._at(key)} = {value} is not a finite number")
        return value

    def integer(self, key: str) -> int | None:
        """A JSON number as an integer (a float truncated, as int() does), None when absent or null."""
        value = self.number(key)
        return None if value is None else int(value)

    def text(self, key: str) -> str | None:
        """A JSON string, None when absent or null."""
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, str):
            raise ValueError(f"{self._at(key)} = {value!r} is not a string")
        return value

    def array(self, key: str) -> tuple[object, ...] | None:
        """A JSON array's items, None when absent or null."""
        value = self.data.get(key)
        if value is None:
            return None
        if isinstance(value, str) or not isinstance(value, Sequence):
            raise ValueError(f"{self._at(key)} = {value!r} is not a list")
        return tuple(value)

    def integers(self, key: str) -> tuple[int, ...] | None:
        """A JSON array of numbers as integers, None when absent or null."""
        items = self.array(key)
        if items is None:
            return None
        if any(isinstance(i, bool) or not isinstance(i, (int, float)) or not math.isfinite(i) for i in items):
            raise ValueError(f"{self._at(key)} = {list(items)!r} is not a list of numbers")
        return tuple(int(i) for i in items if isinstance(i, (int, float)))

    def sub(self, key: str) -> ModelConfig | None:
        """The JSON object under `key` (text_config, vision_config, quantization_config...), else None."""
        value = self.data.get(key)
        if not isinstance(value, Mapping):
            return None
        return ModelConfig(value, self.where, f"{self.prefix}{key}.", self.overridden)

    def items(self) -> tuple[tuple[str, object], ...]:
        """The object's keys and values as decoded (check_numbers walks them)."""
        return tuple((str(k), v) for k, v in self.data.items())


# The keys whose object SGLang merges into the config's own rather than replacing it (a sub-config, or
# these two; utils/hf_transformers/config.py get_config).
_MERGED = ("rope_scaling", "rope_parameters")


def with_override(config: ModelConfig, override: object) -> ModelConfig:
    """config.json as SGLang sees it under --json-model-override-args (a JSON object, as text or decoded).

    utils/hf_transformers/config.py get_config: each key replaces the config's, except an object given for
    a sub-config or for rope_scaling/rope_parameters, which is merged into the one there. ValueError (one
    line) for text that is not a JSON object.
    """
    if override is None or override == "":
        return config
    if isinstance(override, str):
        try:
            override = json.loads(override)
        except ValueError as exc:
            raise ValueError(f"--json-model-override-args is not JSON: {exc}") from None
    if not isinstance(override, Mapping):
        raise ValueError("--json-model-override-args is not a JSON object")
    data = dict(config.data)
    paths = set(config.overridden)
    for key, value in override.items():
        current = data.get(key)
        merge = key in _MERGED or key.endswith("_config")
        if merge and isinstance(value, Mapping) and isinstance(current, Mapping):
            data[key] = {**current, **value}
            paths.update(f"{config.prefix}{key}.{sub}" for sub in value)
        else:
            data[key] = value
            paths.add(f"{config.prefix}{key}")
    return ModelConfig(data, config.where, config.prefix, frozenset(paths))
