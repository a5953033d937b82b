"""The one name tokamax reads from xprof.cli.tools."""
