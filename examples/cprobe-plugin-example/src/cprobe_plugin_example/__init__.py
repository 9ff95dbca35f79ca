"""cprobe-plugin-example: an intervention, a direction, an explainer and a metric registered by entry points
(pyproject.toml); each module imports only ``cprobe.plugin``, the public surface."""

__version__ = "0.1.0"
