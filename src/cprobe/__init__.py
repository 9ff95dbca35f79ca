"""cprobe: a config-driven causal-probing workbench for language models."""

__version__ = "0.1.0"
