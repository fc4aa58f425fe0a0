"""eventlog."""
