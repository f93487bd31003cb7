"""The ``sentcl`` command: one name for what users run, each subcommand the existing entry point's own parser."""
