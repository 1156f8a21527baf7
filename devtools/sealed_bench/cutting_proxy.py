"""A localhost TCP proxy that cuts the connection, or flips one byte, at given totals of
client->server bytes: the "connection cut" of an upload's resume test and benchmark, made without
touching the client or the server."""

from __future__ import annotations

import contextlib
import socket
import threading


class CuttingProxy:
    """Forwards 127.0.0.1:`port` to 127.0.0.1:`upstream`. When the client->server bytes forwarded
    in all pass a value of `cut_at`, that connection is closed mid-stream (both sides); when they pass
    a value of `flip_at`, that byte is XOR-ed with 1 on its way. `cuts`, `flips` count what was done."""

    def __init__(self, upstream: int, cut_at: list[int] | None = None, flip_at: list[int] | None = None) -> None:
        self.upstream = upstream
        self.cut_at, self.flip_at = sorted(cut_at or []), sorted(flip_at or [])
        self.sent = self.cuts = self.flips = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(("127.0.0.1", self.upstream))
                threading.Thread(target=self._up, args=(client, upstream), daemon=True).start()
                threading.Thread(target=self._down, args=(upstream, client), daemon=True).start()

    def _up(self, client: socket.socket, upstream: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := bytearray(client.recv(1 << 16)):
                with self._lock:
                    start, self.sent = self.sent, self.sent + len(data)
                    if self.flip_at and self.flip_at[0] < self.sent:
                        data[self.flip_at.pop(0) - start] ^= 0x01
                        self.flips += 1
                    if self.cut_at and self.cut_at[0] < self.sent:
                        upstream.sendall(data[: self.cut_at.pop(0) - start])
                        self.cuts += 1
                        break
                upstream.sendall(data)
        for s in (client, upstream):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    @staticmethod
    def _down(upstream: socket.socket, client: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := upstream.recv(1 << 16):
                client.sendall(data)

    def close(self) -> None:
        self._listener.close()
