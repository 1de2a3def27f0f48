"""Configs: the catalog and profiles, and models resolved without a catalog entry."""
