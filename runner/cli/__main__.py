"""`python -m qjsflow.runner.cli`."""

from qjsflow.runner.cli.commands import main

raise SystemExit(main())
