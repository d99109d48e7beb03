"""The web dashboard served at ``/ui`` (see ``routes.py``)."""
