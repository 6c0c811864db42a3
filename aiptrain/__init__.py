"""aiptrain: Google AI Platform Training's job model on your own machines."""

__version__ = "0.1.0"
