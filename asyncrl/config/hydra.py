"""Hydra's rules for a command line's overrides, applied before verl's keys are read (`verl.translate`).

verl's entry points parse their command lines with Hydra; a recipe written for them relies on:
- the last occurrence of a key winning (`... ulysses_sequence_parallel_size=4 ...
  ulysses_sequence_parallel_size=1`: the 1 is what runs, and what is checked);
- `+key=value` adding a key verl's schema lacks, `++key=value` adding or overriding, and `~key`
  (or `~key=value`, only if it holds that value) deleting a key and everything under it, so the
  key takes asyncrl's default;
- `${other.key}` interpolation, resolved by OmegaConf (the library Hydra and verl's configs use),
  against the keys of the same command line (asyncrl does not read verl's YAML defaults: a key
  the command line does not set cannot be interpolated, and says so), with OmegaConf's resolvers
  (`${oc.env:HOME}`, `${oc.select:key,default}`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, cast

from asyncrl.errors import ConfigError

Pair = tuple[str, Any]
DELETE = object()
"""The value of a `~key` override with no value: delete the key whatever it holds."""


def apply_hydra(pairs: Iterable[tuple[str, Any]], known: Callable[[str], bool] = lambda _: True) -> list[Pair]:
    """The (key, value) pairs Hydra would compose from these, in order: `~key` deletions applied,
    one pair per key (its last value, under the spelling it had there: `+key` stays `+key`, for
    `verl.translate` to read as a key verl's schema lacks), `${...}` resolved. `known`: whether a
    key exists (ours or verl's): `~key` of any other is Hydra's error, not a silent no-op."""
    final: dict[str, Any] = {}
    spelling: dict[str, str] = {}
    for raw_key, value in pairs:
        if raw_key.startswith("~"):
            if raw_key[1:] not in final and not known(raw_key[1:]):
                raise ConfigError(f"{raw_key}: could not delete {raw_key[1:]}: no such key (Hydra's ~ deletes a "
                                  f"key of the config)")
            _delete(final, raw_key[1:], value)
            continue
        key = raw_key.lstrip("+")
        final.pop(key, None)  # the last occurrence wins, and takes the last place
        final[key], spelling[key] = value, raw_key
    if any(_interpolates(v) for v in final.values()):
        final = _resolve(final)
    return [(spelling[key], value) for key, value in final.items()]


def _delete(final: dict[str, Any], key: str, value: Any) -> None:
    """Hydra's `~key[=value]`: the key and its subtree; with a value, only if the key holds it."""
    if value is not DELETE and key in final and final[key] != value:
        raise ConfigError(f"~{key}={value!r}: the key holds {final[key]!r}, so Hydra would not delete it")
    for name in [k for k in final if k == key or k.startswith(key + ".")]:
        del final[name]


def _interpolates(value: Any) -> bool:
    if isinstance(value, str):
        return "${" in value
    if isinstance(value, dict):
        return any(_interpolates(v) for v in value.values())
    if isinstance(value, list):
        return any(_interpolates(v) for v in value)
    return False


def _resolve(final: dict[str, Any]) -> dict[str, Any]:
    """Every `${...}` resolved by OmegaConf against the command line's own keys."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    tree = OmegaConf.create()
    for key, value in final.items():
        try:
            OmegaConf.update(tree, key, value, force_add=True, merge=False)
        except OmegaConfBaseException:
            pass  # a key under another's value: it is not a target of interpolation either way
    out = dict(final)
    for key, value in final.items():
        if not _interpolates(value):
            continue
        try:
            node = OmegaConf.create({"value": value})
            node._set_parent(tree)  # the value's ${...} are absolute keys of the whole command line
            resolved = OmegaConf.to_container(node, resolve=True)
            out[key] = cast(dict[str, Any], resolved)["value"]
        except OmegaConfBaseException as exc:
            problem = " ".join(str(exc).split("\n")[0].split())
            raise ConfigError(f"{key}={value}: cannot resolve the interpolation ({problem}); asyncrl resolves "
                              f"${{...}} against this command line's keys only, not verl's YAML defaults") from None
    return out
