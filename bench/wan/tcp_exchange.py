#!/usr/bin/python3
"""A reference for the exchange on the shaped links of `bench/run.sh wan`:
the bytes of one Shoal fp32 exchange moved by plain TCP sockets, no gRPC, no
model code. One process per worker namespace.

Per repetition every rank, at the same wall-clock instant (start + rep x
period; one machine, one clock), sends model/N bytes to each other rank
(reduce-scatter) and, once it has received its N-1 contributions, another
model/N bytes to each other rank (all-gather). Its time is from the instant to
the last byte of the all-gather received. Connections are opened once and kept
(like gRPC channels); the pause between repetitions (period) lets TCP idle as
it does while the workers train. Prints `rep R seconds S` per repetition.
"""
import argparse
import socket
import threading
import time

SO_MAX_PACING_RATE = getattr(socket, "SO_MAX_PACING_RATE", 47)  # Linux, bytes per second


def recv_exact(sock, n, buf):
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:n])
        if k == 0:
            raise ConnectionError("peer closed")
        got += k


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--ips", required=True, help="comma-separated, one per rank")
    ap.add_argument("--bytes", type=int, required=True, help="model bytes")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--start", type=float, required=True, help="time.time() of rep 0")
    ap.add_argument("--period", type=float, default=4.0)
    ap.add_argument("--port", type=int, default=29700)
    ap.add_argument("--schedule", choices=("all", "ring"), default="all",
                    help="all: every transfer of a phase at once (as Shoal's fan-out); ring: "
                         "n-1 steps per phase, at step k rank r sends to r+k and receives from "
                         "r-k, so each link carries one flow each way")
    ap.add_argument("--pace_mbit", type=float, default=0,
                    help="cap the rank's uplink at this rate: each outbound socket is paced "
                         "(SO_MAX_PACING_RATE) at it / (the flows a phase runs at once); 0 = "
                         "unpaced")
    args = ap.parse_args()
    ips = args.ips.split(",")
    n = len(ips)
    peers = [k for k in range(n) if k != args.rank]
    part = args.bytes // n
    payload = bytes(part)

    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((ips[args.rank], args.port))
    srv.listen(n)
    inbound = {}

    def accept():
        for _ in peers:
            c, _ = srv.accept()
            k = int(c.recv(1)[0])
            inbound[k] = c

    acceptor = threading.Thread(target=accept)
    acceptor.start()
    outbound = {}
    for k in peers:
        deadline = time.time() + 30
        while True:
            try:
                s = socket.create_connection((ips[k], args.port), timeout=5)
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.1)
        s.settimeout(None)
        if args.pace_mbit > 0:
            flows = 1 if args.schedule == "ring" else n - 1
            s.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE,
                         int(args.pace_mbit * 1e6 / 8 / flows))
        s.sendall(bytes([args.rank]))
        outbound[k] = s
    acceptor.join(timeout=30)

    def ring_phase(buf):
        for k in range(1, n):
            to, frm = (args.rank + k) % n, (args.rank - k) % n
            t = threading.Thread(target=outbound[to].sendall, args=(payload,))
            t.start()
            recv_exact(inbound[frm], part, buf)
            t.join()

    for rep in range(args.reps):
        t0 = args.start + rep * args.period
        time.sleep(max(0.0, t0 - time.time()))
        if args.schedule == "ring":
            buf = bytearray(part)
            ring_phase(buf)   # reduce-scatter
            ring_phase(buf)   # all-gather
            print(f"rep {rep} seconds {time.time() - t0:.4f}", flush=True)
            continue
        reduced = threading.Event()
        received = [0]
        lock = threading.Lock()

        def send(k):
            outbound[k].sendall(payload)   # our copy of k's slice
            reduced.wait()
            outbound[k].sendall(payload)   # our averaged slice

        def recv(k):
            buf = bytearray(part)
            recv_exact(inbound[k], part, buf)   # k's copy of our slice
            with lock:
                received[0] += 1
                if received[0] == len(peers):
                    reduced.set()
            recv_exact(inbound[k], part, buf)   # k's averaged slice

        threads = [threading.Thread(target=send, args=(k,)) for k in peers]
        threads += [threading.Thread(target=recv, args=(k,)) for k in peers]
        for t in threads:
            t.start()
        for t in threads[len(peers):]:
            t.join()
        print(f"rep {rep} seconds {time.time() - t0:.4f}", flush=True)
        for t in threads[:len(peers)]:
            t.join()


if __name__ == "__main__":
    main()
