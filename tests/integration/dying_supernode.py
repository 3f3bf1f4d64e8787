"""A stock SuperNode that dies at the worst moment for its SuperLink's ServerApp: once the file named by its first
argument exists, it exits (as if killed) right after pushing its next reply message and before pushing that
reply's objects, so the SuperLink holds a reply whose objects never come.

    python tests/integration/dying_supernode.py FLAG <flower-supernode's arguments>

Everything else is Flower's own ``flower-supernode`` (``flwr.supernode.cli:flower_supernode``); the fault is the
test's, injected in this process only. Used by tests/integration/test_flower.py.
"""
import os
import sys

from flwr.supernode import start_client_internal
from flwr.supernode.cli import flower_supernode


def main() -> None:
    flag = sys.argv.pop(1)
    push_objects = start_client_internal.push_object_contents_from_iterable

    def push_or_die(*args, **kwargs):
        if os.path.exists(flag):
            os._exit(9)  # the reply message is at the SuperLink; its objects never will be
        return push_objects(*args, **kwargs)

    start_client_internal.push_object_contents_from_iterable = push_or_die
    flower_supernode()


if __name__ == "__main__":
    main()
