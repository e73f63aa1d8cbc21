import contextlib
import threading
import time

from tests.helpers import free_port, one_torch_thread  # noqa: F401  (autouse for this folder)


@contextlib.contextmanager
def running_server(app):
    """A real uvicorn server for `app` on a free loopback port, in a background thread;
    yields (base url, uvicorn server). Leaving the block shuts it down the way SIGTERM does."""
    from specheads.server.launch import make_server

    port = free_port()
    server = make_server(app, "127.0.0.1", port)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.should_exit = True
        thread.join(60)
        assert not thread.is_alive(), "the server did not shut down"
