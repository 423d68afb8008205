"""A TVM RPC server that can load what hhb-tvm's own RPC client sends it.

hhb-tvm's client asks the server to load a module with three arguments (file, options,
compiler), while its Python server's loader takes one, so every remote measurement fails with an
empty ``RPCError``. :func:`start_server` starts TVM's own server with a loader that accepts both.
Run it on each device (``relay-tasks serve --tracker HOST:PORT --key KEY``) to tune through a
tracker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def fix_load_module() -> None:
    """Patch, in the server process, the function that registers the session's loaders.

    Passed to ``tvm.rpc.Server`` as ``server_init_callback``, so it runs where the server runs.
    """
    import tvm
    from tvm.rpc import server

    register = server._server_env

    def server_env(load_library: Any, work_path: Any = None) -> Any:
        temp = register(load_library, work_path)

        @tvm._ffi.register_func("tvm.rpc.server.load_module", override=True)  # type: ignore[untyped-decorator]
        def load_module(file_name: str, options: str = "", cc: str = "g++") -> Any:
            return tvm.runtime.load_module(temp.relpath(file_name))

        return temp

    server._server_env = server_env


def start_server(
    tracker: tuple[str, int], key: str, *, host: str = "127.0.0.1", port: int = 9090
) -> Any:
    """Start an RPC server registered at ``tracker`` under ``key``; returns ``tvm.rpc.Server``.

    It listens on ``host`` only: it runs whatever a client uploads, so reaching it from other
    machines is the caller's explicit choice.
    """
    from tvm.rpc.server import Server

    return _on_a_free_port(
        lambda first: Server(
            host=host,
            port=first,
            port_end=first + 100,
            key=key,
            tracker_addr=tracker,
            silent=True,
            server_init_callback=fix_load_module,
        ),
        port,
    )


def tracker_summary(address: tuple[str, int], timeout: float) -> dict[str, Any]:
    """The tracker's summary (its queue per key, its servers), each step bounded by ``timeout``
    seconds: TVM's own client retries a silent tracker for minutes."""
    import socket
    import struct

    from tvm.rpc import base
    from tvm.rpc.tracker import TrackerCode

    with socket.create_connection(address, timeout=timeout) as sock:
        sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
        (magic,) = struct.unpack("<i", base.recvall(sock, 4))
        if magic != base.RPC_TRACKER_MAGIC:
            raise ConnectionError("what answers there is no TVM RPC tracker")
        base.sendjson(sock, [TrackerCode.SUMMARY])
        code, summary = base.recvjson(sock)
    if code != TrackerCode.SUCCESS or not isinstance(summary, dict):
        raise ConnectionError("the tracker gave no summary")
    return summary


def start_tracker(*, host: str = "127.0.0.1", port: int = 9190) -> Any:
    """Start a TVM RPC tracker on ``host``; returns ``tvm.rpc.tracker.Tracker``."""
    from tvm.rpc.tracker import Tracker

    return _on_a_free_port(
        lambda first: Tracker(host=host, port=first, port_end=first + 100, silent=True), port
    )


def _on_a_free_port(start: Callable[[int], Any], port: int) -> Any:
    """TVM takes the first port it can bind from ``port`` on, then listens: another process can
    take it in between, which fails the start. Retry from the next hundred ports."""
    for attempt in range(ATTEMPTS):
        try:
            return start(port + 100 * attempt)
        except OSError as err:
            if "Address already in use" not in str(err) or attempt == ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


ATTEMPTS = 5
