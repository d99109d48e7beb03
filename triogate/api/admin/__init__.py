"""The admin API: LiteLLM's paths and field names (see ``routes``)."""
