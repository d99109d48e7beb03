"""triogate: an LLM gateway on Trio that waits on Redis once per dependency level."""

__version__ = "0.1.0"
