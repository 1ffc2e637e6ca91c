"""Reading config files: one YAML loader and one strict key checker for every config in treerank.

Every config error names the file, the key path (``models.linear.trainer.lr``) and, for an
unknown key, the allowed keys. Training configs share one shape (see
``treerank.training.config``); experiment files (``treerank.pipeline.config``) use the same
helpers.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

__all__ = [
    "ConfigError",
    "YamlLoader",
    "allowed_keys",
    "build",
    "check_keys",
    "check_type",
    "check_types",
    "expected_text",
    "load_yaml",
    "parse_yaml",
    "section",
]

T = TypeVar("T")


class ConfigError(ValueError):
    """A config is malformed; the message names the file, the key path and the problem."""


class YamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's float rule (the one rule for every YAML treerank
    reads: config files, experiment files, sweep grids and ``--grid`` values).

    PyYAML implements YAML 1.1, whose float pattern needs a dot, so ``1e-2`` and ``5E3`` are
    read as strings; YAML 1.2's core schema (and every other YAML library in use) reads them as
    floats. Everything else is PyYAML's 1.1 safe schema (``yes``/``no`` booleans included).
    """


#: YAML 1.2 core-schema floats (``[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?``, with
#: ``_`` digit separators as 1.1 allows) plus 1.1's ``.inf`` / ``.nan`` spellings.
YAML12_FLOAT = re.compile(
    r"""^(?:[-+]?(?:\.[0-9][0-9_]*|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)
YamlLoader.add_implicit_resolver("tag:yaml.org,2002:float", YAML12_FLOAT, list("-+0123456789."))


def parse_yaml(text: str) -> Any:
    """``text`` read as YAML with :class:`YamlLoader` (``"1e-2"`` -> ``0.01``).

    Raises:
        yaml.YAMLError: not valid YAML.
    """
    return yaml.load(text, Loader=YamlLoader)  # noqa: S506 (a SafeLoader subclass)


def load_yaml(path: str | Path, *, what: str = "config") -> dict[str, Any]:
    """Read a YAML file whose top level is a mapping (an empty file is ``{}``), numbers read by
    YAML 1.2's rule (:class:`YamlLoader`: ``1e-2`` is a float).

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
        doc = parse_yaml(path.read_text(encoding="utf-8"))
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


_KIND_WORDS = {
    bool: "a boolean (true/false)",
    int: "an integer",
    float: "a number",
    str: "a string",
    Path: "a path (a string)",
    type(None): "null",
    dict: "a mapping",
    list: "a list",
    tuple: "a list",
}


def expected_text(annotation: Any) -> str:
    """How a message words the type ``annotation``: ``"an integer"``, ``"a number or null"``,
    ``"a list of 2 numbers"``, ``"one of 'batch', 'all'"``."""
    if isinstance(annotation, tuple):  # an isinstance() tuple
        return " or ".join(expected_text(a) for a in annotation)
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(expected_text(a) for a in args)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_plural(expected_text(args[0]))}"
        if args and len(set(args)) == 1:
            return f"a list of {len(args)} {_plural(expected_text(args[0]))}"
        return f"a list of {len(args)} values"
    if origin is list and args:
        return f"a list of {_plural(expected_text(args[0]))}"
    if origin in (list, dict):
        return _KIND_WORDS[origin]
    return _KIND_WORDS.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _plural(text: str) -> str:
    return {"an integer": "integers", "a number": "numbers", "a string": "strings"}.get(text, text)


def _matches(value: Any, annotation: Any) -> bool | None:
    """Whether ``value`` (as YAML gives it) fits ``annotation``; ``None``: not checkable."""
    if annotation is Any or annotation is object:
        return True
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        results = [_matches(value, a) for a in args]
        if any(r is True for r in results):
            return True
        return None if any(r is None for r in results) else False
    if origin is typing.Literal:
        return value in args
    if origin is tuple or annotation is tuple:
        if not isinstance(value, list | tuple):
            return False
        if not args:
            return True
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_matches(v, args[0]) is not False for v in value)
        return len(value) == len(args) and all(
            _matches(v, a) is not False for v, a in zip(value, args, strict=True)
        )
    if origin is list or annotation is list:
        if not isinstance(value, list):
            return False
        return not args or all(_matches(v, args[0]) is not False for v in value)
    if origin is dict or annotation is dict:
        return isinstance(value, dict)
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, str)
    if annotation is Path:
        return isinstance(value, str | Path)
    if annotation is type(None):
        return value is None
    return None


def check_type(value: Any, annotation: Any, where: str) -> None:
    """Refuse a config value that does not fit its declared type, before any work.

    Integers are accepted where a number (``float``) is declared; booleans are never integers;
    YAML lists fill tuple fields. Annotations it cannot check (classes, callables) pass.

    Args:
        value: the value as read from YAML (or a ``--grid`` setting).
        annotation: the field's or parameter's resolved type.
        where: ``"<file>: <key path>"``.

    Raises:
        ConfigError: ``"<where>: expected an integer, got 'three'"``.
    """
    if _matches(value, annotation) is False:
        raise ConfigError(f"{where}: expected {expected_text(annotation)}, got {value!r}")


def type_hints(target: Any) -> dict[str, Any]:
    """The resolved annotations of a dataclass's fields or a class's ``__init__`` keyword
    parameters (``{}`` where they cannot be resolved)."""
    if dataclasses.is_dataclass(target) or not isinstance(target, type):
        fns: list[Any] = [target]
    else:  # follow **kwargs into the base classes' __init__, as allowed_keys does
        fns = []
        for owner in target.__mro__:
            if owner is object:
                break
            fns.append(owner.__init__)  # type: ignore[misc]
            try:
                params = inspect.signature(owner.__init__).parameters  # type: ignore[misc]
            except (TypeError, ValueError):
                break
            if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
                break
    hints: dict[str, Any] = {}
    for fn in fns:
        try:
            found = typing.get_type_hints(fn)
        except Exception:  # noqa: BLE001 (unresolvable annotations: nothing to check)
            continue
        for key, value in found.items():
            if key not in ("return", "kwargs", "args"):
                hints.setdefault(key, value)
    return hints


def check_types(doc: Mapping[str, Any], target: Any, where: str) -> None:
    """:func:`check_type` on every key of ``doc`` that ``target`` annotates.

    Raises:
        ConfigError: the first value of the wrong type (its key path and expected type).
    """
    hints = type_hints(target)
    for key, value in doc.items():
        if key in hints:
            check_type(value, hints[key], f"{where}.{key}")


def build(cls: type[T], doc: Any, where: str, *, exclude: Iterable[str] = ()) -> T:
    """Instantiate dataclass ``cls`` from a mapping, strictly.

    Every value is first checked against its field's type (:func:`check_types`), so a range
    check never meets a string. Tuple-typed fields accept YAML lists. A ``ValueError`` /
    ``TypeError`` raised by the dataclass (its ``__post_init__`` range checks) becomes a
    :class:`ConfigError` naming ``where``.

    Raises:
        ConfigError: unknown key, a value of the wrong type (``"<where>.epochs: expected an
            integer, got 'three'"``), or a value the dataclass rejects.
    """
    d = check_keys(doc, allowed_keys(cls), where, exclude=exclude)
    check_types(d, cls, where)
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
