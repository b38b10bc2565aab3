"""Testing workflows before publishing them: the real sandbox and journal on a virtual clock,
with mocked tools, given events and mocked steps (the implementation: `qjsflow.runner.testing`)."""

from qjsflow.runner.testing import Idle, MockTool, VirtualClock, WorkflowTest

__all__ = ["Idle", "MockTool", "VirtualClock", "WorkflowTest"]
