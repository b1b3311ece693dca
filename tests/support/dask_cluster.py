"""The test suites' LocalCluster: no fixed port, so another Dask cluster on the machine (a
notebook's, another test run's) never collides with it.

``dashboard_address=None`` is not enough: the scheduler still starts its HTTP server (health,
metrics) on 8787 and warns when that is taken, which the suite's filters make an error. Here
the scheduler has no dashboard and its HTTP server and its own port are both chosen by the
system (port 0); workers' HTTP servers take port 0 already.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from distributed import Client, LocalCluster

#: The HTTP server of the scheduler, on a free port of the loopback interface only.
HTTP_ADDRESS = "127.0.0.1:0"


def local_cluster(**kwargs: Any) -> LocalCluster:
    """``LocalCluster(**kwargs)`` with the scheduler on port 0 and no fixed HTTP port."""
    scheduler_kwargs = {"dashboard": False, "dashboard_address": HTTP_ADDRESS,
                        **kwargs.pop("scheduler_kwargs", {})}
    return LocalCluster(scheduler_port=0, dashboard_address=None,
                        scheduler_kwargs=scheduler_kwargs, **kwargs)


@contextlib.contextmanager
def process_client(timeout: float = 90) -> Iterator[Client]:
    """A client of a fresh cluster of two single-threaded worker processes (2 GiB each), its
    workers waited for (``timeout`` seconds); the cluster is closed after."""
    cluster = local_cluster(n_workers=2, threads_per_worker=1, processes=True,
                            memory_limit="2GiB")
    try:
        with Client(cluster) as client:
            client.wait_for_workers(2, timeout=timeout)
            yield client
    finally:
        cluster.close(timeout=timeout)
