"""Running the app under uvicorn in a thread of the current process (tests, benchmarks, the UI tests)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


def loopback_socket() -> socket.socket:
    """A socket bound to a free loopback port: bind first when the app must know its own port (the
    mounted UI's client calls back into the same server)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


@contextmanager
def serve_in_thread(
    app, sock: socket.socket | None = None, join_timeout: float = 30.0, start_timeout: float = 120.0
) -> Iterator[str]:
    """uvicorn on `sock` (default: a free loopback port) in a thread; real sockets, the app's lifespan
    runs. Yields the base URL; raises if the server has not started within `start_timeout`."""
    import uvicorn

    sock = sock or loopback_socket()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    try:
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the sd2 service did not start (see the log above)")
            time.sleep(0.02)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(join_timeout)
