"""Driving runs: `RunDriver` takes a run's lease and drives it in an executor; each drive is a
`DriveSession` whose lease moves through the states of runner/engine/drive/lease.py."""

from qjsflow.runner.engine.drive.beginning import BeforeLease, Presuming
from qjsflow.runner.engine.drive.driver import RunDriver
from qjsflow.runner.engine.drive.runs import SIGNAL_TIMER, park_paused

__all__ = ["SIGNAL_TIMER", "BeforeLease", "Presuming", "RunDriver", "park_paused"]
