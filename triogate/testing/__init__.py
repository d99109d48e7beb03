"""Test tools shipped with the gateway: a fake OpenAI/Anthropic upstream server.

The batch library keeps its own fakes in ``triogate.batch.testing``."""
