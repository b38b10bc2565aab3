# The two commands of the README. Each installs what it needs first (scripts/setup.sh).
.PHONY: setup demo test lint

setup:
	@scripts/setup.sh

demo: setup
	@scripts/demo.sh

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy

test: lint
	.venv/bin/pytest
