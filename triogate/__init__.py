"""triogate: an LLM gateway on Trio that waits on Redis once per dependency level."""

__version__ = "0.1.0"
#: The LiteLLM release whose proxy API (paths, fields, answers) triogate follows.
LITELLM_VERSION = "1.108.7"
