#!/usr/bin/env python3
"""sparkfleet fabric probe: measure the fabric between two of a lane's ranks, over their fabric IPs.

Runs on the node with the system python3 and the standard library only (copied like facts.py). One
JSON request on stdin, one JSON document on stdout:

  {"mode": "serve", "bind": IP, "port": P, "allow": [IP, ...], "sessions": N, "timeout_s": T}
      listen on IP:P (never 0.0.0.0) and answer drivers from the `allow` addresses until N sessions
      ended (N 0: any number), a `quit` arrives or T seconds pass; prints what it served.
  {"mode": "drive", "source": IP, "peer": IP, "port": P, "allow": [IP, ...], "rtt_sizes": [B, ...],
   "rtt_count": K, "bulk_bytes": B, "bulk_parts": N, "connect_wait_s": W}
      connect from IP (this node's fabric address) to the peer's server and measure: round-trip time
      of each size (K echoes, both ends spinning while one is on its way: the least and the median),
      then one-way bandwidth of `bulk_bytes` each way in N timed pieces (the best piece: CPU noise
      only slows a piece), timed by the driver from its request to the last byte's receipt. A peer
      outside `allow` is refused before any packet is sent.
  {"mode": "quit", "bind": IP, "port": P}
      tell this node's own server to stop (the controller's clean-up when a driver never came).

Wire format: each request is a 4-byte big-endian length plus JSON; payloads are raw bytes.
Exit 0 with a document (its "error" says what failed); exit 2 for a request that is not valid.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
import threading
import time

CHUNK = 1 << 20


def _send_msg(s: socket.socket, doc: dict) -> None:
    data = json.dumps(doc).encode()
    s.sendall(struct.pack(">I", len(data)) + data)


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        got = s.recv(min(CHUNK, n - len(buf)))
        if not got:
            raise ConnectionError("the peer closed the connection")
        buf += got
    return bytes(buf)


def _recv_msg(s: socket.socket) -> dict:
    (n,) = struct.unpack(">I", _recv_exact(s, 4))
    if n > 1 << 16:
        raise ValueError("request too long")
    return json.loads(_recv_exact(s, n))


def _sink(s: socket.socket, n: int) -> float:
    """Read n bytes; the seconds from the first byte to the last."""
    left = n
    first = None
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    while left:
        got = s.recv_into(view, min(CHUNK, left))
        if not got:
            raise ConnectionError("the peer closed the connection")
        if first is None:
            first = time.perf_counter()
        left -= got
    return time.perf_counter() - (first or time.perf_counter())


def _echoes(s: socket.socket, payload: bytes | None, size: int, count: int, timeout_s: float) -> list[float]:
    """`count` echoes of `size` bytes: the driver sends `payload` and times each until it is back; the
    server (payload None) sends back what it got. Both ends spin on a non-blocking socket, yielding the
    CPU, instead of sleeping in recv: NCCL's proxy spins too, so the round trip is the path's and not
    the time a sleeping host takes to wake (an idle core's exit from its C-state, a VM's halted vCPU;
    on two vCPUs shared by the sim's nodes that wake read 3.5x the whole 48 KB echo, docs/fabric.md)."""
    times = []
    timeout = s.gettimeout()
    s.setblocking(False)
    buf = bytearray(size)
    try:
        for _ in range(count):
            deadline = time.monotonic() + timeout_s
            t0 = time.perf_counter()
            if payload is not None:
                _spin(s, payload, deadline, send=True)
            _spin(s, buf, deadline, send=False)
            if payload is None:
                _spin(s, buf, deadline, send=True)
            times.append(time.perf_counter() - t0)
    finally:
        s.settimeout(timeout)
    return times


def _spin(s: socket.socket, data: bytes | bytearray, deadline: float, *, send: bool) -> None:
    """Send all of `data`, or fill it from the socket, without sleeping; raise once `deadline` passes."""
    view, done = memoryview(data), 0
    while done < len(view):
        try:
            n = s.send(view[done:]) if send else s.recv_into(view[done:])
        except BlockingIOError:
            n = None
        if n == 0 and not send:
            raise ConnectionError("the peer closed the connection")
        if n:
            done += n
        elif time.monotonic() > deadline:
            raise TimeoutError("no echo within the probe's I/O timeout")
        else:
            os.sched_yield()


def _blast(s: socket.socket, n: int) -> None:
    block = b"\0" * CHUNK
    left = n
    while left:
        k = min(CHUNK, left)
        s.sendall(block[:k] if k < CHUNK else block)
        left -= k


# -- server -----------------------------------------------------------------------------------------

HELLO = {"probe": "sparkfleet-fabric", "version": 1}


def _session(conn: socket.socket, state: dict) -> None:
    conn.settimeout(state["timeout_s"])
    try:
        _send_msg(conn, HELLO)  # so a driver knows it reached the probe, not whatever else holds the port
        while True:
            msg = _recv_msg(conn)
            op = msg.get("op")
            if op == "echo":
                _echoes(conn, None, int(msg["size"]), int(msg["count"]), state["timeout_s"])
            elif op == "sink":
                seconds = _sink(conn, int(msg["size"]))
                _send_msg(conn, {"seconds": seconds})
            elif op == "pull":
                _blast(conn, int(msg["size"]))
            elif op == "bye":
                state["done"] += 1
                return
            elif op == "quit":
                state["quit"] = True
                return
            else:
                _send_msg(conn, {"error": f"unknown op {op!r}"})
                return
    except (OSError, ValueError, ConnectionError) as exc:
        state["errors"].append(f"session: {exc}")
    finally:
        conn.close()


def serve(req: dict) -> dict:
    bind, port = str(req["bind"]), int(req["port"])
    allow = set(req.get("allow") or [])
    state = {"done": 0, "quit": False, "errors": [], "refused": [], "timeout_s": float(req.get("timeout_s", 120))}
    sessions = int(req.get("sessions", 0))
    deadline = time.monotonic() + state["timeout_s"]
    try:
        ls = socket.socket(socket.AF_INET6 if ":" in bind else socket.AF_INET, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((bind, port))
        ls.listen(16)
    except OSError as exc:
        return {"mode": "serve", "bind": bind, "port": port, "error": f"cannot listen on {bind}:{port}: "
                f"{exc.strerror or exc}"}
    ls.settimeout(0.2)
    threads = []
    try:
        # sessions 0: answer any number of sessions until `quit` (or the deadline)
        while not state["quit"] and (not sessions or state["done"] < sessions) and time.monotonic() < deadline:
            try:
                conn, addr = ls.accept()
            except TimeoutError:
                continue
            if addr[0] not in allow and addr[0] != bind:
                state["refused"].append(addr[0])  # not one of the lane's fabric addresses
                conn.close()
                continue
            t = threading.Thread(target=_session, args=(conn, state), daemon=True)
            t.start()
            threads.append(t)
    finally:
        ls.close()
    for t in threads:
        t.join(timeout=1.0)
    out = {"mode": "serve", "bind": bind, "port": port, "sessions": state["done"], "refused": state["refused"],
           "errors": state["errors"]}
    if not state["quit"] and (not sessions or state["done"] < sessions):
        out["timed_out"] = True
    return out


# -- driver -----------------------------------------------------------------------------------------

def _connect(source: str, peer: str, port: int, wait_s: float) -> socket.socket:
    """Connect from `source`, retrying a refused connection while the peer's server starts."""
    deadline = time.monotonic() + wait_s
    while True:
        s = socket.socket(socket.AF_INET6 if ":" in peer else socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(max(1.0, wait_s))
        try:
            s.bind((source, 0))  # leave through this node's fabric address, nowhere else
            s.connect((peer, port))
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return s
        except ConnectionRefusedError:
            s.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
        except OSError:
            s.close()
            raise


def drive(req: dict) -> dict:
    source, peer, port = str(req["source"]), str(req["peer"]), int(req["port"])
    out: dict = {"mode": "drive", "source": source, "peer": peer, "port": port}
    allow = set(req.get("allow") or [])
    if peer not in allow or source not in allow:
        out["error"] = f"refused: {peer if peer not in allow else source} is not one of the lane's fabric addresses"
        return out
    start = time.perf_counter()
    try:
        s = _connect(source, peer, port, float(req.get("connect_wait_s", 5.0)))
    except OSError as exc:
        out["error"] = f"cannot connect from {source} to {peer}:{port}: {exc.strerror or exc}"
        return out
    try:
        s.settimeout(float(req.get("connect_wait_s", 5.0)))
        try:
            hello = _recv_msg(s)
        except (OSError, ValueError, ConnectionError):
            hello = None
        if hello != HELLO:
            out["error"] = (f"{peer}:{port} answered, but not as sparkfleet's fabric probe: another program "
                            "holds the port there")
            return out
        s.settimeout(float(req.get("io_timeout_s", 60.0)))
        rtt, median = {}, {}
        count = int(req.get("rtt_count", 10))
        for size in req.get("rtt_sizes") or []:
            size = int(size)
            payload = b"\1" * size
            _send_msg(s, {"op": "echo", "size": size, "count": count + 1})
            # the first echo warms the path (window, caches) and is not counted
            times = sorted(_echoes(s, payload, size, count + 1, float(req.get("io_timeout_s", 60.0)))[1:])
            rtt[str(size)] = times[0]  # the least: what the path can do (a busy CPU only adds)
            median[str(size)] = times[len(times) // 2]
        out["rtt_s"] = rtt
        out["rtt_median_s"] = median
        bulk = int(req.get("bulk_bytes", 0))
        parts = max(1, int(req.get("bulk_parts", 4)))
        if bulk:
            # `bulk` bytes each way in `parts` timed pieces, each from its request to its last byte (out: to
            # the peer's receipt), never from the receiver's first byte (a receiver scheduled late finds
            # megabytes already buffered). The link's figure is its best piece: a busy CPU only slows a
            # piece down, the link never speeds one up.
            piece = max(1, bulk // parts)
            outs, ins = [], []
            for _ in range(parts):
                t0 = time.perf_counter()
                _send_msg(s, {"op": "sink", "size": piece})
                _blast(s, piece)
                _recv_msg(s)
                outs.append(piece * 8 / max(time.perf_counter() - t0, 1e-9))
            for _ in range(parts):
                t0 = time.perf_counter()
                _send_msg(s, {"op": "pull", "size": piece})
                _sink(s, piece)
                ins.append(piece * 8 / max(time.perf_counter() - t0, 1e-9))
            out["out_bps"], out["in_bps"] = max(outs), max(ins)
            out["out_bps_pieces"], out["in_bps_pieces"] = outs, ins
        _send_msg(s, {"op": "bye"})
    except (OSError, ValueError, KeyError, ConnectionError) as exc:
        out["error"] = f"{source} -> {peer}:{port} broke off: {exc}"
    finally:
        s.close()
    out["elapsed_s"] = time.perf_counter() - start
    return out


def quit_server(req: dict) -> dict:
    bind, port = str(req["bind"]), int(req["port"])
    try:
        with socket.create_connection((bind, port), timeout=2.0, source_address=(bind, 0)) as s:
            _send_msg(s, {"op": "quit"})
        return {"mode": "quit", "bind": bind, "port": port, "stopped": True}
    except OSError as exc:
        return {"mode": "quit", "bind": bind, "port": port, "stopped": False, "error": exc.strerror or str(exc)}


def main() -> int:
    text = sys.stdin.read() if not sys.stdin.isatty() else ""
    try:
        req = json.loads(text)
        mode = req["mode"]
        fn = {"serve": serve, "drive": drive, "quit": quit_server}[mode]
    except (ValueError, KeyError, TypeError) as exc:
        sys.stderr.write(f"fabric_probe.py: a request with mode serve, drive or quit is expected on stdin ({exc})\n")
        return 2
    try:
        doc = fn(req)
    except (KeyError, ValueError, TypeError) as exc:
        sys.stderr.write(f"fabric_probe.py: bad {mode} request: {exc}\n")
        return 2
    sys.stdout.write(json.dumps(doc) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
