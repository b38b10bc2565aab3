"""The `qjsflow` command line: its parser, the commands that read, control and host, and
what they print. `python -m qjsflow.runner.cli` runs it."""
