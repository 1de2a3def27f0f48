"""The `shoal` commands as a user runs them: refusals before any work, `shoal serve`, processes and signals, status."""
