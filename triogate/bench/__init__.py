"""Benchmarks shipped with the gateway: the round-trip table (``triogate bench roundtrips``)."""
