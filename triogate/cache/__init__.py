"""The exact-match response cache: its key (``key``), the participant and post-call SET
(``response``), and stream assembly and replay (``replay``)."""
