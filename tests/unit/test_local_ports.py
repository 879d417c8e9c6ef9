"""The local stack's port checks see what a server's bind would see."""

from __future__ import annotations

import socket
import sys

import pytest

from common.errors import StackError
from rankstream.cluster import BUS_OFFSET, NODE_PORTS, free_node_port
from rankstream.stack import _run_quiet, ephemeral_low, free_port, free_port_pair, port_bindable, port_open


def test_a_port_held_by_a_clients_connection_is_not_bindable_though_nothing_listens_there():
    with socket.socket() as server, socket.socket() as client:
        server.bind(("127.0.0.1", 0))
        server.listen()
        client.bind(("127.0.0.1", 0))  # the client's local end: what an ephemeral port looks like
        held = client.getsockname()[1]
        client.connect(server.getsockname())
        assert not port_open(held)  # the old connect probe: "free"
        assert not port_bindable(held)  # what Kafka's bind met in CI


def test_a_listening_port_is_not_bindable_and_a_free_one_is():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert not port_bindable(server.getsockname()[1])
    assert port_bindable(free_port())


def test_a_free_pair_has_both_ports_free():
    port = free_port_pair()
    assert port_bindable(port) and port_bindable(port + 1)


def test_a_free_port_is_outside_the_range_client_connections_take():
    """On Linux, below the kernel's ephemeral range (and the cluster nodes' ports): no outgoing
    connection can take it while the server that was given it starts."""
    low = ephemeral_low()
    if low is None:  # not Linux: the kernel's own pick
        assert port_bindable(free_port())
        return
    ports = [free_port() for _ in range(50)]
    assert all(10_000 <= port < min(low, 20_000) and port_bindable(port) for port in ports)
    pair = free_port(span=2)
    assert pair + 1 < min(low, 20_000)


def test_a_failed_step_says_what_the_jvm_said_not_its_stack_frames():
    """A local stack step that fails (e.g. formatting Kafka's storage) reports the exception's own
    lines: a Java stack trace ends in frames, which say nothing of the cause."""
    trace = (
        "Exception in thread main java.lang.RuntimeException: Invalid cluster.id\\n"
        "\\tat kafka.tools.StorageTool$.formatCommand(StorageTool.scala:120)\\n"
        "\\tat kafka.tools.StorageTool$.execute(StorageTool.scala:79)\\n"
        "\\t... 3 more\\n"
    )
    script = f"import sys; sys.stderr.write('{trace}'); sys.exit(1)"
    with pytest.raises(StackError) as failed:
        _run_quiet([sys.executable, "-c", script], "formatting Kafka storage", timeout=30)
    said = str(failed.value)
    assert "Invalid cluster.id" in said
    assert "StorageTool.scala" not in said and "more" not in said


def test_a_cluster_node_and_its_bus_are_outside_the_range_client_connections_take():
    """A node's port and its bus (the port + 10000) both below the kernel's ephemeral range."""
    low = ephemeral_low()
    ports = [free_node_port(set()) for _ in range(50)]
    assert all(port_bindable(port) and port_bindable(port + BUS_OFFSET) for port in ports)
    if low is not None and low - BUS_OFFSET - NODE_PORTS[0] >= 100:
        assert all(NODE_PORTS[0] <= port and port + BUS_OFFSET < low for port in ports)
