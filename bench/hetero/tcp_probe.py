#!/usr/bin/python3
"""Plain TCP over the hetero bench's links: what the link itself allows.

`tcp_probe.py serve PORT`: in each fast member's namespace, a peer that, per
connection, reads a one-byte mode and a 16-byte count, then either takes
that many bytes (mode r, answering one byte when all are in) or sends them
(mode s).

`tcp_probe.py send IPS UP DOWN`: in the slow member's namespace, opens one
connection per peer and direction at once, sends UP bytes to and takes DOWN
bytes from each peer in IPS (comma-separated), and prints the wall seconds
when all are done. With UP and DOWN both set, this is the slow member's
traffic in a round's exchange (its contribution's slices out, the averages
in), moved by the kernel's TCP alone: no gRPC, no codec, no reduce.

Used by hetero.py (bench/run.sh hetero): the `tcp_s=` figure.
"""
import socket
import sys
import threading
import time

BLOCK = 1 << 20


def _take(conn, n):
    got = 0
    while got < n:
        b = conn.recv(BLOCK)
        if not b:
            break
        got += len(b)
    return got


def _give(conn, n):
    buf = b"x" * BLOCK
    left = n
    while left > 0:
        k = min(left, BLOCK)
        conn.sendall(buf[:k])
        left -= k


def _serve_one(conn):
    with conn:
        conn.settimeout(600)
        head = _take_exact(conn, 17)
        mode, n = head[:1], int(head[1:].decode().strip())
        if mode == b"r":
            _take(conn, n)
            conn.sendall(b"k")
        else:
            _give(conn, n)


def _take_exact(conn, n):
    out = b""
    while len(out) < n:
        b = conn.recv(n - len(out))
        if not b:
            raise ConnectionError("peer closed")
        out += b
    return out


def serve(port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(16)
    while True:
        c, _ = s.accept()
        threading.Thread(target=_serve_one, args=(c,), daemon=True).start()


def send(ips, port, up, down):
    errors = []

    def one(ip, mode, n):
        try:
            with socket.create_connection((ip, port), timeout=600) as c:
                c.sendall(mode + str(n).ljust(16).encode())
                if mode == b"r":
                    _give(c, n)
                    _take_exact(c, 1)
                else:
                    if _take(c, n) != n:
                        raise ConnectionError(f"{ip}: short read")
        except Exception as e:  # reported below, the probe fails
            errors.append(f"{ip} {mode.decode()}: {e}")

    threads = []
    for ip in ips:
        if up:
            threads.append(threading.Thread(target=one, args=(ip, b"r", up)))
        if down:
            threads.append(threading.Thread(target=one, args=(ip, b"s", down)))
    t = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=900)
    if errors or any(th.is_alive() for th in threads):
        print("tcp_probe: " + "; ".join(errors or ["timed out"]), file=sys.stderr)
        return 1
    print(f"{time.monotonic() - t:.3f}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    elif len(sys.argv) == 6 and sys.argv[1] == "send":
        sys.exit(send(sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4]),
                      int(sys.argv[5])))
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
