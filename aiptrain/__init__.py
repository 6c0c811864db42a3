"""aiptrain: Google AI Platform Training's job model on your own machines.

`aiptrain.Client` is the Python API (aiptrain/client.py), imported on first use so that
`import aiptrain` stays light."""

from aiptrain.codeversion import __version__ as __version__

__all__ = ["Client"]


def __getattr__(name: str):
    if name == "Client":
        from aiptrain.client import Client

        return Client
    raise AttributeError(f"module 'aiptrain' has no attribute {name!r}")
