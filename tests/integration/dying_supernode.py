"""A SuperNode that dies at the worst moment for its SuperLink's ServerApp: once the file named by its first
argument exists, it exits (as if killed) right after pushing its next reply message and before pushing that
reply's objects, so the SuperLink holds a reply whose objects never come.

    python tests/integration/dying_supernode.py FLAG <pflkit.flower.supernode's arguments>

Everything else is pflkit's SuperNode (``pflkit.flower.supernode``). Used by tests/integration/test_flower.py.
"""
import os
import sys

from flwr.supernode import start_client_internal

from pflkit.flower import supernode


def main() -> None:
    flag = sys.argv.pop(1)
    push_objects = start_client_internal.push_object_contents_from_iterable

    def push_or_die(*args, **kwargs):
        if os.path.exists(flag):
            os._exit(9)  # the reply message is at the SuperLink; its objects never will be
        return push_objects(*args, **kwargs)

    start_client_internal.push_object_contents_from_iterable = push_or_die
    supernode.main()


if __name__ == "__main__":
    main()
