"""Options shared by several ``treerank`` commands, parsed once at the CLI edge.

``--device``: every command that encodes or scores (``embed``, ``train``, ``evaluate``,
``diagnose``, ``search``, ``index``, ``serve``) takes the same option and turns it into a typed
:class:`~treerank.kernels.device.Device` with :func:`cli_device` before any work, so an unknown
spelling (``gpu``) or CUDA on a machine without it (``cuda``, ``cuda:7``, ``CUDA``) is exit code 2
with one message everywhere.
"""

from __future__ import annotations

import typer

from treerank.cli.errors import fail
from treerank.kernels.device import DEFAULT_DEVICE_TEXT, Device, DeviceError, parse_device

DEVICE_HELP = "Where to compute: auto (a CUDA GPU when there is one), cpu, cuda or cuda:N."


def device_option(default: str = DEFAULT_DEVICE_TEXT, help: str = DEVICE_HELP) -> str:
    """The ``--device`` option (typer default object; the value is a string to pass to
    :func:`cli_device`)."""
    return typer.Option(default, "--device", help=help)  # type: ignore[no-any-return]


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
