"""`shoal tune` and the quality gate: measure this machine and write a profile for it."""
