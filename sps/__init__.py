"""Stream processing workers (a later issue)."""
