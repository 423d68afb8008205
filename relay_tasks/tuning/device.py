"""Whether devices behind an RPC tracker can measure: asked before a tune starts and while it
runs, so a wrong address, a mistyped key or a dead device is one line instead of a silent wait."""

from __future__ import annotations

import time

from ..errors import TuningError

#: Seconds a tracker gets to answer, and a device to show up free there, before a tune starts.
TRACKER_TIMEOUT = 5.0


def check_tracker(tracker: tuple[str, int], key: str) -> None:
    """Raise :class:`TuningError` unless the tracker answers and a server with ``key`` is free
    there within :data:`TRACKER_TIMEOUT` seconds: a wrong address, a mistyped key or a dead
    device otherwise waits in silence for minutes."""
    deadline = time.monotonic() + TRACKER_TIMEOUT
    while True:
        problem = _tracker_problem(tracker, key)
        if problem is None:
            return
        if time.monotonic() >= deadline:
            raise TuningError(problem)
        time.sleep(0.25)


def _tracker_problem(tracker: tuple[str, int], key: str) -> str | None:
    """Why no measurement can start at ``tracker`` under ``key`` now, or None."""
    from ..rpc import tracker_summary

    where = f"{tracker[0]}:{tracker[1]}"
    try:
        summary = tracker_summary(tracker, TRACKER_TIMEOUT)
    except (OSError, ValueError) as err:
        why = err.strerror if isinstance(err, OSError) and err.strerror else str(err) or "no answer"
        return (f"no RPC tracker answers at {where} ({why}); start one "
                "(python -m tvm.exec.rpc_tracker) or fix --rpc-tracker")  # fmt: skip
    queues = summary.get("queue_info", {})
    if key not in queues:
        known = ", ".join(sorted(queues)) or "none"
        return (
            f"no device is registered at {where} under --rpc-key {key!r} (keys there: "
            f"{known}); start relay-tasks serve on the device with it, or fix --rpc-key"
        )
    if not int(queues[key].get("free", 0)):
        return f"every device under --rpc-key {key!r} at {where} is busy; wait for them, or add one"
    return None


def devices_left(tracker: tuple[str, int], key: str) -> str | None:
    """Why no device under ``key`` can measure any more (the tracker gone, or no server
    registered under the key, busy or free), or None. A server that dies drops its registration
    at once; the tracker hands the tune's next requests to the others."""
    from ..rpc import tracker_summary

    where = f"{tracker[0]}:{tracker[1]}"
    try:
        summary = tracker_summary(tracker, TRACKER_TIMEOUT)
    except (OSError, ValueError):
        return f"the RPC tracker at {where} stopped answering"
    servers = summary.get("server_info", [])
    if any(isinstance(s, dict) and s.get("key") == f"server:{key}" for s in servers):
        return None
    return f"no device is left under --rpc-key {key!r} at {where}"
