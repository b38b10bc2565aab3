"""Workers as orchestrators see them: Prometheus metrics from a real worker process, health
probes, JSON log lines, and a graceful stop on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import httpx
import orjson
import pytest

from tests.conftest import PROJECT_ROOT
from tests.net import free_port
from tests.test_cli import Cli

pytestmark = pytest.mark.slow  # real worker processes

FLOW = """
export default async (event, step) => {
  const a = await step.do("a", async () => 1);
  const slow = await step.tool("slow", "slow", { run: event.instanceId, seconds: event.payload });
  return [a, slow];
};
"""


class Workers(Cli):
    """The CLI over a journal with one workflow published, and worker processes on it."""

    lease_ttl = "2"

    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path)
        tree = tmp_path / "src" / "workflows"
        tree.mkdir(parents=True)
        (tree / "flow.js").write_text(FLOW)
        self.ok("publish", str(tree.parent), "--scope", "acme")

    def start(self, run_id: str, seconds: float) -> None:
        self.ok("start", "flow", "--scope", "acme", "--snapshot", "latest", "--run-id", run_id,
                 "--input", str(seconds))  # fmt: skip

    def worker(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(self.argv("worker", *args), cwd=PROJECT_ROOT, env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def _wait_for(url: str) -> httpx.Response:
    deadline = time.monotonic() + 30
    while True:
        try:
            return httpx.get(url, timeout=2)
        except httpx.TransportError:
            assert time.monotonic() < deadline, f"nothing answers at {url}"
            time.sleep(0.1)


def _sample(metrics: str, name: str) -> float:
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_metrics_move_as_runs_complete_and_probes_answer(tmp_path: Path) -> None:
    workers = Workers(tmp_path)
    metrics_port, health_port = free_port(), free_port()
    worker = workers.worker("--metrics-port", str(metrics_port), "--health-port",
                            str(health_port), "--log-format", "json")  # fmt: skip
    try:
        before = _wait_for(f"http://127.0.0.1:{metrics_port}/metrics").text
        assert _sample(before, 'qjsflow_drives_total{outcome="completed"}') == 0
        assert _wait_for(f"http://127.0.0.1:{health_port}/healthz").text == "ok"
        assert httpx.get(f"http://127.0.0.1:{health_port}/readyz").status_code == 200
        assert httpx.get(f"http://127.0.0.1:{health_port}/nope").status_code == 404
        for n in range(3):
            workers.start(f"r{n}", 0.05)
        deadline = time.monotonic() + 60
        while True:
            scraped = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
            if _sample(scraped, 'qjsflow_drives_total{outcome="completed"}') >= 3:
                break
            assert time.monotonic() < deadline, scraped[-2000:]
            time.sleep(0.2)
        assert _sample(scraped, 'qjsflow_steps_total{kind="tool",outcome="ok"}') == 3
        assert _sample(scraped, 'qjsflow_steps_total{kind="do",outcome="ok"}') == 3
        assert _sample(scraped, "qjsflow_journal_commit_seconds_count") > 0
        # Usage charged to the scope's budgets: three tool calls (one per run), each run's
        # steps (a do, a tool) and drives.
        assert _sample(scraped, 'qjsflow_scope_usage_total{measure="tool_calls",scope="acme"}') == 3
        assert _sample(scraped, 'qjsflow_scope_usage_total{measure="steps",scope="acme"}') == 6
        assert _sample(scraped, 'qjsflow_scope_usage_total{measure="drives",scope="acme"}') >= 3
        assert "r0" not in scraped  # no run ids as labels
        assert _sample(scraped, 'qjsflow_workers{state="live"}') == 1  # itself, registered
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=60)
    lines = [orjson.loads(line) for line in err.splitlines() if line.startswith("{")]
    drove = [line for line in lines if line["message"].startswith("drove acme/")]
    assert len(drove) >= 3
    assert {line["level"] for line in drove} == {"info"}


def test_sigterm_finishes_the_drive_in_progress(tmp_path: Path) -> None:
    workers = Workers(tmp_path)
    workers.start("slow", 2.0)
    worker = workers.worker()
    deadline = time.monotonic() + 30
    while "slow slow" not in workers.tool_log.read_text():  # inside the 2-second tool call
        assert time.monotonic() < deadline
        time.sleep(0.05)
    worker.send_signal(signal.SIGTERM)
    _, err = worker.communicate(timeout=30)
    assert worker.returncode == 0
    assert "stopping: finishing 1 drives in progress" in err
    assert workers.ok("result", "slow") == [1, "slow done"]  # finished, not abandoned
    assert workers.tool_log.read_text().count("slow slow") == 1
