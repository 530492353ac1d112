"""tilecast: forecast, then run, tiled training of GPT language models."""

__version__ = "0.1.0"
