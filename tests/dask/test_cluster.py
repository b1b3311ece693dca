"""The suites' LocalCluster takes no fixed port: it starts while another cluster holds Dask's
default ports (8786 for the scheduler, 8787 for its HTTP server)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import pytest

pytest.importorskip("distributed")

from distributed import Client
from support.dask_cluster import local_cluster


@contextlib.contextmanager
def held(port: int) -> Iterator[None]:
    """Listen on ``port`` of every interface, as another cluster's scheduler would; when
    something else holds it already, the port is taken all the same."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        with contextlib.suppress(OSError):
            sock.bind(("0.0.0.0", port))
            sock.listen(1)
        yield
    finally:
        sock.close()


def test_a_cluster_starts_while_the_default_ports_are_taken() -> None:
    with held(8786), held(8787):
        # Warnings are errors in this suite: Dask's "port 8787 is already in use" would fail.
        with local_cluster(n_workers=1, threads_per_worker=1, processes=False) as cluster, \
                Client(cluster) as client:
            assert client.submit(sum, [1, 2]).result(timeout=30) == 3
            ports = {sock.getsockname()[1]
                     for sock in cluster.scheduler.http_server._sockets.values()}
            assert ports and not ports & {8786, 8787}
