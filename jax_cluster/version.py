"""The package version, in one place (pyproject.toml's must match)."""

VERSION = "0.1.0"
