"""Options shared by several ``treerank`` commands, parsed once at the CLI edge.

``--device``: every command that encodes or scores (``embed``, ``train``, ``evaluate``,
``diagnose``, ``search``, ``index``, ``serve``) takes the same option and turns it into a typed
:class:`~treerank.kernels.device.Device` with :func:`cli_device` before any work, so an unknown
spelling (``gpu``) or CUDA on a machine without it (``cuda``, ``cuda:7``, ``CUDA``) is exit code 2
with one message everywhere.

``--overwrite``: every command that writes an output folder (``train``, ``evaluate``,
``diagnose``) takes the same option (:func:`overwrite_option`, one help text), passed to
:func:`treerank.atomic.refuse_existing_output` before any work.

A command's option that sets a field of a settings record (``DiagnosticsSettings``,
``EvaluationSettings``) is made by :func:`field_option`: its default and help text are the
field's, so neither is typed twice.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import typer

from treerank.cli.errors import fail
from treerank.kernels.device import DEFAULT_DEVICE_TEXT, Device, DeviceError, parse_device

DEVICE_HELP = "Where to compute: auto (a CUDA GPU when there is one), cpu, cuda or cuda:N."
OVERWRITE_HELP = (
    "Write into a non-empty --out (refused without it); the old files stay until the new "
    "ones are complete."
)


def device_option(default: str = DEFAULT_DEVICE_TEXT, help: str = DEVICE_HELP) -> str:
    """The ``--device`` option (typer default object; the value is a string to pass to
    :func:`cli_device`)."""
    return typer.Option(default, "--device", help=help)  # type: ignore[no-any-return]


def overwrite_option() -> bool:
    """The ``--overwrite`` flag of the commands that write an output folder (typer default
    object; the value is a ``bool``, default ``False``)."""
    return typer.Option(False, "--overwrite", help=OVERWRITE_HELP)  # type: ignore[no-any-return]


def field_option(record: type, name: str, *flags: str, **options: Any) -> Any:
    """A typer option for the field ``name`` of the settings dataclass ``record``: the field's
    default and its ``metadata["help"]`` (``options`` passes more ``typer.Option`` keywords).

    Raises:
        KeyError: ``record`` has no field ``name``, or the field has no help text (at import of
            the command module, so a renamed field fails every CLI test).
    """
    found = {f.name: f for f in dataclasses.fields(record)}
    if name not in found or "help" not in found[name].metadata:
        raise KeyError(f"{record.__name__}.{name}: no such field with a help text")
    f = found[name]
    if f.default is dataclasses.MISSING:
        raise KeyError(f"{record.__name__}.{name}: a field without a default is not an option")
    return typer.Option(f.default, *flags, help=f.metadata["help"], **options)


def cli_device(spec: str) -> Device:
    """Parse ``--device`` (see :func:`~treerank.kernels.device.parse_device`).

    Raises:
        typer.Exit: code 2 after printing the reason (an unknown spelling, CUDA unavailable,
            an index torch does not see).
    """
    try:
        return parse_device(spec)
    except DeviceError as exc:
        raise fail(f"--device {spec}: {exc}") from None
