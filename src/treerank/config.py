"""Reading config files: one YAML loader and one strict key checker for every config in treerank.

Every config error names the file, the key path (``models.linear.trainer.lr``) and, for an
unknown key, the allowed keys. Training configs share one shape (see
``treerank.training.config``); experiment files (``treerank.pipeline.config``) use the same
helpers.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

__all__ = ["ConfigError", "allowed_keys", "build", "check_keys", "load_yaml", "section"]

T = TypeVar("T")


class ConfigError(ValueError):
    """A config is malformed; the message names the file, the key path and the problem."""


def load_yaml(path: str | Path, *, what: str = "config") -> dict[str, Any]:
    """Read a YAML file whose top level is a mapping (an empty file is ``{}``).

    Raises:
        FileNotFoundError: no such file.
        ConfigError: a directory, not valid YAML, or the top level is not a mapping.
    """
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory; the {what} must be a YAML file")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: {what} file not found")
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})") from exc
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(doc).__name__}")
    return doc


def allowed_keys(target: Any) -> list[str]:
    """The keys a config section may hold for ``target``.

    ``target`` is a dataclass (its fields), a class or function (its keyword parameters,
    following ``**kwargs`` into the base classes' ``__init__``), or an iterable of names.
    """
    if dataclasses.is_dataclass(target) and isinstance(target, type):
        return [f.name for f in dataclasses.fields(target) if f.init]
    if isinstance(target, type) or callable(target):
        names: list[str] = []
        classes = target.__mro__ if isinstance(target, type) else (target,)
        for owner in classes:
            fn = owner.__init__ if isinstance(owner, type) else owner  # type: ignore[misc]
            if owner is object:
                break
            try:
                params = inspect.signature(fn).parameters
            except (TypeError, ValueError):
                break
            more = False
            for p in params.values():
                if p.kind is inspect.Parameter.VAR_KEYWORD:
                    more = True
                elif p.name != "self" and p.kind is not inspect.Parameter.VAR_POSITIONAL:
                    names.append(p.name)
            if not more:
                break
        return list(dict.fromkeys(names))
    return list(target)


def check_keys(
    doc: Any, allowed: Iterable[str], where: str, *, exclude: Iterable[str] = ()
) -> dict[str, Any]:
    """``doc`` as a dict after checking it is a mapping whose keys are all in ``allowed``.

    Args:
        doc: the section (``None`` counts as empty).
        allowed: the allowed keys.
        where: ``"<file>: <key path>"``, used in the messages.
        exclude: keys that are never allowed here (e.g. ``dim``, taken from the store).

    Raises:
        ConfigError: not a mapping, or an unknown key (the message lists the allowed ones).
    """
    if doc is None:
        return {}
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{where}: must be a mapping, got {type(doc).__name__}")
    ok = [k for k in allowed if k not in set(exclude)]
    unknown = [str(k) for k in doc if k not in ok]
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))}; allowed: {', '.join(ok)}"
        )
    return dict(doc)


def build(cls: type[T], doc: Any, where: str, *, exclude: Iterable[str] = ()) -> T:
    """Instantiate dataclass ``cls`` from a mapping, strictly.

    Tuple-typed fields accept YAML lists. A ``ValueError`` / ``TypeError`` raised by the
    dataclass (its ``__post_init__`` range checks) becomes a :class:`ConfigError` naming
    ``where``.

    Raises:
        ConfigError: unknown key, or a value the dataclass rejects.
    """
    d = check_keys(doc, allowed_keys(cls), where, exclude=exclude)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in d and isinstance(d[f.name], list) and "tuple" in str(f.type):
            d[f.name] = tuple(d[f.name])
    try:
        return cls(**d)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def section(doc: Mapping[str, Any], name: str, where: str) -> dict[str, Any]:
    """``doc[name]`` as a dict (missing or null: ``{}``).

    Raises:
        ConfigError: the section is not a mapping.
    """
    value = doc.get(name)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}.{name}: must be a mapping, got {type(value).__name__}")
    return dict(value)
