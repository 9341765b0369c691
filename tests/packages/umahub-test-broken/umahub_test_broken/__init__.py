"""Plugins that fail to load, each in its own way."""
