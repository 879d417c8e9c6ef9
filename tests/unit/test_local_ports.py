"""The local stack's port checks see what a server's bind would see."""

from __future__ import annotations

import socket

from rankstream.stack import free_port, free_port_pair, port_bindable, port_open


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
