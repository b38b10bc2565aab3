"""A test host of the test's own: a network namespace joined to this one by a veth pair, so a
worker can run "on another machine" whose link the test slows (a token bucket) and cuts.
Addresses are on a /30 of the test's own, used only between the two ends."""

from __future__ import annotations

import contextlib
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@dataclass(frozen=True)
class LinkedHost:
    namespace: str
    host_device: str  # this namespace's end of the link
    peer_device: str  # the test host's end
    host_address: str  # this end's address, where servers for the test host listen
    peer_address: str

    def command(self, *argv: str) -> list[str]:
        """`argv` run on the test host."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def slow(self, rate: str = "8kbit") -> None:
        """Both directions of the link through a token bucket of `rate`."""
        for argv, device in ((["tc"], self.host_device),
                             (self.command("tc"), self.peer_device)):  # fmt: skip
            subprocess.run(
                [*argv, "qdisc", "add", "dev", device, "root", "tbf", "rate", rate,
                 "burst", "1600", "latency", "60s"],
                check=True, capture_output=True, text=True, timeout=30,
            )  # fmt: skip

    def cut(self) -> None:
        """The link goes down: nothing crosses it, in either direction, and no end is told."""
        _ip("link", "set", self.host_device, "down")


@contextlib.contextmanager
def linked_host(third_octet: int = 213) -> Iterator[LinkedHost]:
    tag = secrets.token_hex(3)
    block = secrets.randbelow(60) * 4
    host = LinkedHost(
        namespace=f"qjf-{tag}", host_device=f"qjh{tag}", peer_device=f"qjp{tag}",
        host_address=f"10.{third_octet}.{block // 256}.{block % 256 + 1}",
        peer_address=f"10.{third_octet}.{block // 256}.{block % 256 + 2}",
    )  # fmt: skip
    _ip("netns", "add", host.namespace)
    try:
        _ip("link", "add", host.host_device, "type", "veth", "peer", "name", host.peer_device)
        _ip("link", "set", host.peer_device, "netns", host.namespace)
        _ip("addr", "add", f"{host.host_address}/30", "dev", host.host_device)
        _ip("link", "set", host.host_device, "up")
        inside = ["netns", "exec", host.namespace, "ip"]
        _ip(*inside, "addr", "add", f"{host.peer_address}/30", "dev", host.peer_device)
        _ip(*inside, "link", "set", host.peer_device, "up")
        _ip(*inside, "link", "set", "lo", "up")
        yield host
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("link", "del", host.host_device)
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("netns", "del", host.namespace)
