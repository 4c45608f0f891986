"""The base image runs Python, and `network_mode="none"` leaves a container no route to the host."""

from __future__ import annotations

import json
import os
import socket
import uuid

import pytest

pytestmark = pytest.mark.docker

LABEL = "hrl.test"

# Runs inside the container: report the interfaces and try the host's listening port by every address we know.
PROBE = """
import json, socket, sys
port, addresses = int(sys.argv[1]), sys.argv[2:]
reached = {}
for address in addresses:
    try:
        socket.create_connection((address, port), timeout=3).close()
        reached[address] = "connected"
    except OSError as exc:
        reached[address] = type(exc).__name__
interfaces = sorted(name for _, name in socket.if_nameindex())
print(json.dumps({"python": sys.version_info[0], "interfaces": interfaces, "reached": reached}))
"""


def host_addresses() -> list[str]:
    """Loopback plus the host's outward-facing address (a UDP connect sends nothing)."""
    addresses = ["127.0.0.1"]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: only picks the route
            addresses.append(probe.getsockname()[0])
        except OSError:
            pass
    return addresses


def test_base_image_runs_python_without_network() -> None:
    import docker

    client = docker.from_env()
    image = os.environ.get("HRL_BASE_IMAGE", "hrl/base:bookworm")
    for stale in client.containers.list(all=True, filters={"label": f"{LABEL}=1"}):
        stale.remove(force=True)

    with socket.create_server(("0.0.0.0", 0)) as listener:
        port = listener.getsockname()[1]
        addresses = host_addresses()
        for address in addresses:  # the port is reachable from the host's own network namespace
            socket.create_connection((address, port), timeout=3).close()
            listener.accept()[0].close()

        container = client.containers.run(
            image,
            ["python3", "-c", PROBE, str(port), *addresses],
            network_mode="none",
            labels={LABEL: "1", f"{LABEL}.run": uuid.uuid4().hex},
            detach=True,
        )
        try:
            status = container.wait(timeout=60)
            output = container.logs().decode()
        finally:
            container.remove(force=True)

        listener.settimeout(0)
        with pytest.raises(BlockingIOError):  # nothing from the container got through
            listener.accept()

    assert status["StatusCode"] == 0, output
    report = json.loads(output.strip().splitlines()[-1])
    assert report["python"] == 3
    assert report["interfaces"] == ["lo"]
    assert all(result != "connected" for result in report["reached"].values()), report
    assert set(report["reached"]) == set(addresses)
    assert client.containers.list(all=True, filters={"label": f"{LABEL}=1"}) == []
    client.close()
