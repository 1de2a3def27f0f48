"""Tuning and precision: the auto profile, the quality gate, `shoal tune`, shipped profiles holding on a machine."""
