#!/usr/bin/python3
"""A TCP proxy that delays every byte it forwards, both ways: the control
connection (gRPC) between decode and a prefill with added delay and jitter,
where the kernel has no netem.  Order is kept: a chunk never leaves before
the one read before it.

usage: delay_proxy.py LISTEN_HOST:PORT TARGET_HOST:PORT DELAY_MS JITTER_MS
Prints "ready" once it listens; runs until killed.
"""
import queue
import random
import socket
import sys
import threading
import time


def pump(src, dst, delay, jitter):
    q = queue.Queue()

    def writer():
        while True:
            due, data = q.get()
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if data is None:
                break
            try:
                dst.sendall(data)
            except OSError:
                break
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    threading.Thread(target=writer, daemon=True).start()
    last = 0.0
    while True:
        try:
            data = src.recv(65536)
        except OSError:
            data = b""
        due = max(last, time.monotonic() + (delay + random.uniform(-jitter, jitter)) / 1000.0)
        last = due
        q.put((due, data or None))
        if not data:
            break


def serve(conn, target, delay, jitter):
    try:
        up = socket.create_connection(target)
    except OSError:
        conn.close()
        return
    for s in (conn, up):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    threading.Thread(target=pump, args=(conn, up, delay, jitter), daemon=True).start()
    threading.Thread(target=pump, args=(up, conn, delay, jitter), daemon=True).start()


def main():
    lh, lp = sys.argv[1].rsplit(":", 1)
    th, tp = sys.argv[2].rsplit(":", 1)
    delay, jitter = float(sys.argv[3]), float(sys.argv[4])
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((lh, int(lp)))
    ls.listen(64)
    print("ready", flush=True)
    while True:
        conn, _ = ls.accept()
        serve(conn, (th, int(tp)), delay, jitter)


if __name__ == "__main__":
    main()
