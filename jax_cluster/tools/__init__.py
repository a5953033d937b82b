"""Command-line tools built on the library; the library imports nothing from here."""
