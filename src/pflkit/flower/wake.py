"""A SuperNode's word to pflkit's SuperExec that it holds a new message: the SuperExec asks for the task at once.

Flower's SuperExec learns of a task only by asking its SuperNode (``AcquireTask``), once per poll interval;
pflkit's backed off from 0.01 s after each launch, so that a task was found soon after it came. That cost about a
dozen asks per node per round, every one a request the SuperNode serves, on a deployment whose cores are all busy
(``benchmarks/flower_requests.py``). On pflkit's deployment a SuperNode and the SuperExec serving it run on the
same machine, so the SuperNode says when a message has arrived and its objects are stored (:func:`notifier`: one
datagram on a Unix socket, naming the SuperNode's pid; pflkit's deployment uses Linux's abstract namespace, and
runs without the word elsewhere), and the SuperExec's loop for that node waits on it (:class:`Wakes`) with
Flower's poll interval as the longest wait. A word lost (the SuperExec not listening yet, its socket's buffer
full) costs at most that interval: the poll still comes.
"""
from __future__ import annotations

import os
import socket
import threading
from collections import defaultdict


def socket_address(path: str) -> str:
    """The socket address of ``path``: a file's path, or ``@name`` for Linux's abstract namespace (no file, gone
    with the socket)."""
    return "\0" + path[1:] if path.startswith("@") else path


def notifier(path: str):
    """A function that tells the SuperExec listening at ``path`` that this process (a SuperNode) holds a new
    message. It never raises: without a listener the SuperExec's poll finds the task."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.setblocking(False)
    word = str(os.getpid()).encode()

    def notify() -> None:
        try:
            sock.sendto(word, socket_address(path))
        except OSError:
            pass
    return notify


class Wakes:
    """The SuperExec's side: a Unix datagram socket at ``path`` and a thread that turns each word (a SuperNode's
    pid) into a wake-up of the loop that serves that node. ``wait(pid, seconds)`` returns when that node said it
    holds a message since the last wait returned, or after ``seconds``."""

    def __init__(self, path: str):
        self.path = path
        self._events: dict[int, threading.Event] = defaultdict(threading.Event)
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(socket_address(path))
        threading.Thread(target=self._listen, name="superexec wakes", daemon=True).start()

    def _event(self, pid: int) -> threading.Event:
        with self._lock:
            return self._events[pid]

    def _listen(self) -> None:
        while True:
            try:
                word = self._sock.recv(64)
            except OSError:  # the socket closed
                return
            try:
                self._event(int(word)).set()
            except ValueError:
                continue  # not a pid: ignored

    def wait(self, pid: int, seconds: float) -> bool:
        """Wait for node ``pid``'s word, at most ``seconds``; True if it came."""
        event = self._event(pid)
        woken = event.wait(seconds)
        event.clear()
        return woken

    def close(self) -> None:
        self._sock.close()
        if not self.path.startswith("@"):
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
