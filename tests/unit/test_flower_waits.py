"""How pflkit's SuperNode and SuperExec wait for work (``pflkit.flower.waits``, ``pflkit.flower.supernode``):
the idle wait starts at ``FIRST_WAIT``, grows by ``GROWTH`` up to Flower's own wait and restarts on activity,
per thread; the SuperNode's empty-pull wait backs off while its local reply waits stay short; and the Flower
code whose waits these replace still waits where and as they expect (a Flower upgrade that moves them fails
here, not as a silently slow deployment)."""
import inspect
import sys
import threading
import time
import types

import pytest

from pflkit.flower import supernode, waits


def test_the_idle_wait_grows_to_the_longest_and_restarts_on_activity():
    b = waits.Backoff(first=0.01, growth=2.0)
    assert [b.next_wait(0.05) for _ in range(2)] == [0.05, 0.05]  # before any activity: Flower's own wait
    b.reset()
    assert [b.next_wait(0.05) for _ in range(5)] == [0.01, 0.02, 0.04, 0.05, 0.05]  # exact: powers of two
    b.reset()
    assert b.next_wait(0.05) == 0.01
    assert b.next_wait(0.005) == 0.005  # never over the longest the caller allows
    with pytest.raises(ValueError, match="growth"):
        waits.Backoff(first=0.01, growth=0.5)


def test_each_thread_backs_off_on_its_own():
    b = waits.Backoff(first=0.01, growth=2.0)
    b.reset()
    for _ in range(3):
        b.next_wait(1.0)
    seen = []
    thread = threading.Thread(target=lambda: seen.append(b.next_wait(1.0)))
    thread.start()
    thread.join()
    assert seen == [1.0] and b.next_wait(1.0) == 0.08  # the new thread has seen no activity yet


def test_the_supernodes_empty_pull_wait_backs_off_and_a_reply_wait_is_short(monkeypatch):
    slept = []
    monkeypatch.setattr(waits.time, "sleep", slept.append)
    monkeypatch.setattr(supernode.time, "sleep", slept.append)
    sleep = supernode.node_sleep(waits.Backoff(first=0.01, growth=2.0))
    # an empty pull before any message, a message's reply waits, three empty pulls
    for seconds in (3, 0.5, 0.5, 3, 3, 3):
        sleep(seconds)
    assert slept == [3, waits.FIRST_WAIT, waits.FIRST_WAIT, 0.01, 0.02, 0.04]


def test_replace_time_gives_one_module_its_own_sleep_and_keeps_the_rest_of_time():
    module = types.ModuleType("flowerlike")
    module.time = time
    calls = []
    waits.replace_time(module, calls.append)
    module.time.sleep(3)
    assert calls == [3] and module.time.monotonic is time.monotonic and time.sleep is not calls.append
    with pytest.raises(RuntimeError, match="no longer imports the time module"):
        waits.replace_time(types.ModuleType("moved_on"), calls.append)


def test_flowers_loops_still_wait_where_pflkit_replaces_their_waits():
    pytest.importorskip("flwr")
    from flwr.supercore.superexec import run_superexec
    from flwr.supernode import start_client_internal

    node = inspect.getsource(start_client_internal)
    assert "import time\n" in node
    assert node.count(f"time.sleep({supernode.EMPTY_PULL_WAIT:g})") == 1  # after an empty pull
    assert node.count("time.sleep(0.5)") == 2  # waiting for the reply and its objects: local, kept short
    exec_loop = inspect.getsource(run_superexec)
    assert "import time\n" in exec_loop and exec_loop.count("time.sleep(") == 1
    assert "time.sleep(task_poll_interval)" in exec_loop


def test_quick_object_retries_passes_the_first_wait_once_and_refuses_a_changed_flower():
    def pull(object_ids, pull_object_fn, max_time=7200.0, initial_backoff=1.0, backoff_cap=10.0):
        return initial_backoff, backoff_cap, max_time

    module = types.ModuleType("flowerlike")
    module.pull_objects = pull
    installed = waits.quick_object_retries(module, "pull_objects", 0.25)
    assert waits.quick_object_retries(module, "pull_objects", 0.5) is installed  # a second time changes nothing
    assert module.pull_objects is installed and installed.function is pull and installed.first == 0.25
    assert module.pull_objects([], None) == (0.25, 10.0, 7200.0)  # the cap and the limit stay Flower's
    installed.deadline = time.monotonic() + 1000
    assert 999 < module.pull_objects([], None)[2] <= 1000  # the time left, as Flower's max_time
    installed.deadline = time.monotonic() - 5
    assert module.pull_objects([], None)[2] == 0.0  # past it: every object asked for once
    module.pull_objects = lambda object_ids, pull_object_fn, initial_backoff=1.0: None
    with pytest.raises(RuntimeError, match="flowerlike.pull_objects is no longer an object pull"):
        waits.quick_object_retries(module, "pull_objects", 0.25)
    with pytest.raises(RuntimeError, match="flowerlike.gone is no longer"):
        waits.quick_object_retries(module, "gone", 0.25)


def test_a_missing_object_is_asked_for_again_after_the_first_wait_not_flowers_second(monkeypatch):
    """Flower's own ``pull_objects``, given pflkit's first wait: the object is missing at the first ask and
    there at the second, and the wait between them (Flower's jitter set to 0) is the one given, where
    Flower's default waits ``PULL_INITIAL_BACKOFF`` (1 s). The waits are recorded, not timed."""
    pytest.importorskip("flwr")
    from flwr.supercore import constant
    from flwr.supercore.inflatable import inflatable_utils as flower

    waited = []

    class Event(threading.Event):
        def wait(self, timeout=None):
            waited.append(timeout)
            return self.is_set()

    monkeypatch.setattr(flower, "threading", types.SimpleNamespace(Event=Event, Lock=threading.Lock))
    monkeypatch.setattr(flower, "random", types.SimpleNamespace(uniform=lambda a, b: 0.0))
    monkeypatch.setattr(flower, "pull_objects", flower.pull_objects)  # restored after the test

    def pull_once_missing():
        asked = []

        def pull_object(object_id):
            asked.append(object_id)
            if len(asked) == 1:
                raise flower.ObjectUnavailableError(object_id)
            return b"content"
        return pull_object

    assert flower.pull_objects(["a"], pull_once_missing()) == {"a": b"content"}
    assert waited == [constant.PULL_INITIAL_BACKOFF] == [1]  # Flower's default: a second
    waited.clear()
    waits.quick_object_retries(flower, "pull_objects", waits.SERVER_OBJECT_RETRY)
    assert flower.pull_objects(["a"], pull_once_missing()) == {"a": b"content"}
    assert waited == [waits.SERVER_OBJECT_RETRY] == [0.01]


def test_pflkits_supernode_clientapp_and_serverapp_shorten_flowers_object_retries(monkeypatch):
    """Where Flower's SuperNode loop, ClientApp runtime and deployment grid pull a message's objects, they
    leave the first wait at Flower's default; pflkit's SuperNode (``shorten_waits``) and forked ClientApp replace
    it with ``NODE_OBJECT_RETRY``, ``PollingGrid`` with ``SERVER_OBJECT_RETRY`` (each module restored after the
    test)."""
    pytest.importorskip("flwr")
    import flwr.supernode.runtime.run_clientapp as clientapp_runtime
    from flwr.superlink.grid import http_grid
    from flwr.supernode import start_client_internal

    from pflkit.flower import apps, superexec

    for module, name in ((start_client_internal, "pull_objects"), (http_grid, "pull_objects"),
                         (clientapp_runtime, "pull_and_inflate_object_from_tree")):
        source = inspect.getsource(module)
        assert f"{name}(" in source and "initial_backoff" not in source  # called, with Flower's first wait
        monkeypatch.setattr(module, name, getattr(module, name))
    monkeypatch.setattr(start_client_internal, "time", start_client_internal.time)

    supernode.shorten_waits()
    assert start_client_internal.pull_objects.first == waits.NODE_OBJECT_RETRY
    apps.PollingGrid(grid=None)
    assert http_grid.pull_objects.first == waits.SERVER_OBJECT_RETRY
    import flwr.supernode.cli

    monkeypatch.setattr(flwr.supernode.cli, "flwr_clientapp", lambda: None)
    monkeypatch.setattr(sys, "argv", sys.argv)  # run_clientapp sets the ClientApp's
    superexec.run_clientapp(["flwr-clientapp"], quiet=False)
    assert clientapp_runtime.pull_and_inflate_object_from_tree.first == waits.NODE_OBJECT_RETRY


def test_a_pull_with_a_deadline_gives_up_at_it_where_flowers_asks_500_times(monkeypatch):
    """Flower's own ``pull_objects`` for an object that never comes (its sender died between pushing the message
    and its objects): by default it asks ``PULL_MAX_TRIES_PER_OBJECT`` times (10 s apart at the cap: more than an
    hour); with a deadline that has passed it asks once and gives up. Waits are recorded, not slept."""
    pytest.importorskip("flwr")
    from flwr.supercore import constant
    from flwr.supercore.inflatable import inflatable_utils as flower

    class Event(threading.Event):
        def wait(self, timeout=None):
            return self.is_set()

    monkeypatch.setattr(flower, "threading", types.SimpleNamespace(Event=Event, Lock=threading.Lock))
    monkeypatch.setattr(flower, "pull_objects", flower.pull_objects)  # restored after the test
    asked = []

    def never_there(object_id):
        asked.append(object_id)
        raise flower.ObjectUnavailableError(object_id)

    with pytest.raises(flower.ObjectPullError):
        flower.pull_objects(["a"], never_there)
    assert len(asked) == constant.PULL_MAX_TRIES_PER_OBJECT == 500
    pull = waits.quick_object_retries(flower, "pull_objects", waits.SERVER_OBJECT_RETRY)
    asked.clear()
    pull.deadline = time.monotonic()
    with pytest.raises(flower.ObjectPullError):
        flower.pull_objects(["a"], never_there)
    assert asked == ["a"]


def _reply(node: int, to: str, content):
    """A reply from ``node`` to the message ``to``, with its message ID, as a SuperNode pushes it."""
    from flwr.app import Metadata
    from flwr.app.message import make_message

    metadata = Metadata(run_id=3, message_id="", src_node_id=node, dst_node_id=1, message_type="train", group_id="2",
                        ttl=60.0, reply_to_message_id=to, created_at=0.0)
    reply = make_message(metadata=metadata, content=content)
    reply.metadata.__dict__["_message_id"] = reply.object_id
    return reply


def _polling_grid(monkeypatch, runtime_api, sent: list[str]):
    """``PollingGrid`` over Flower's deployment grid (``HttpGrid``) whose Runtime API is ``runtime_api``; pushing
    gives the message IDs ``sent``. Returns Flower's grid and pflkit's."""
    from flwr.superlink.grid import http_grid

    from pflkit.flower import apps

    monkeypatch.setattr(http_grid, "pull_objects", http_grid.pull_objects)  # restored after the test
    flower_grid = http_grid.HttpGrid(token="t")
    flower_grid._client = runtime_api
    flower_grid._run = types.SimpleNamespace(run_id=3)
    grid = apps.PollingGrid(flower_grid)
    monkeypatch.setattr(grid, "push_messages", lambda messages: sent)
    return flower_grid, grid


def _send_and_receive(grid, timeout: float):
    """``grid.send_and_receive`` with ``timeout`` in a thread given a minute (Flower's own pull of objects that
    never come would keep asking for more than an hour); its replies, or None if it did not return."""
    done = []
    worker = threading.Thread(target=lambda: done.append(grid.send_and_receive([], timeout=timeout)), daemon=True)
    worker.start()
    worker.join(60)
    return done[0] if done else None


def _answered(replies, node_of: dict[int, int], timeout: float):
    """What ``Exchange`` makes of ``replies`` to a train pass sent to the clients of ``node_of``."""
    from pflkit.flower import apps

    exchange = apps.Exchange(node_of, timeout=timeout)
    exchange._down = {}
    return exchange.replies({c: types.SimpleNamespace(kind="train") for c in node_of}, replies, 2)


def test_a_reply_whose_objects_never_come_is_no_reply_at_the_passs_timeout(monkeypatch):
    """Flower's deployment grid (``HttpGrid``, its Runtime API stubbed) holds a reply whose objects are never
    available: ``PollingGrid.send_and_receive`` returns at its timeout; Flower's grid gave it its stand-in error
    reply (sent from the SuperLink's node), which it returns to no one, so ``Exchange`` has no reply from the
    client; the pull's deadline is cleared after."""
    pytest.importorskip("flwr")
    from flwr.app import ConfigRecord, RecordDict
    from flwr.app.message import remove_content_from_message
    from flwr.common.serde import message_to_proto
    from flwr.proto.message_pb2 import PullObjectResponse
    from flwr.proto.runtime_pb2 import PullAppMessagesResponse
    from flwr.supercore.inflatable.inflatable_object import get_object_tree, iterate_object_tree

    reply = _reply(7, "sent", RecordDict({"c": ConfigRecord({"loss": 1.0})}))
    asked = []

    class RuntimeApi:
        def PullMessages(self, request):
            return PullAppMessagesResponse(messages_list=[message_to_proto(remove_content_from_message(reply))],
                                           message_object_trees=[get_object_tree(reply)])

        def PullObject(self, request):
            asked.append(request.object_id)
            return PullObjectResponse(object_found=True, object_available=False)

    flower_grid, grid = _polling_grid(monkeypatch, RuntimeApi(), ["sent"])
    pulled = []
    flowers_pull = flower_grid.pull_messages
    monkeypatch.setattr(flower_grid, "pull_messages", lambda ids: pulled.extend(flowers_pull(ids)) or pulled[-1:])
    replies = _send_and_receive(grid, timeout=0.3)
    assert replies is not None, "send_and_receive did not return at its timeout"
    assert replies == []  # the stand-in answers for no client: nobody gets it
    [stand_in] = pulled
    assert stand_in.has_error() and stand_in.metadata.reply_to_message_id == "sent"
    assert stand_in.metadata.src_node_id == flower_grid.node.node_id != 7
    assert asked and set(asked) <= {tree.object_id for tree in iterate_object_tree(get_object_tree(reply))}
    assert grid.object_pull.deadline is None
    assert _answered(replies, {0: 7}, timeout=0.3) == {}  # no reply from client 0: the server decides what follows


def test_the_replies_that_came_while_a_dead_nodes_objects_held_the_pull_are_collected(monkeypatch):
    """Node 1 pushed its reply and died before its objects (CI saw it: a SuperNode killed mid-pass); the pull
    that met that reply waited for its objects until the pass's timeout, and node 0's reply arrived meanwhile.
    ``PollingGrid.send_and_receive`` pulls once more after such a pull and returns node 0's reply (before, it
    returned none: the run stopped naming every client as silent, not just the dead one). Flower's
    deployment grid (``HttpGrid``), its Runtime API stubbed: the first pull finds node 1's reply, later ones
    node 0's."""
    pytest.importorskip("flwr")
    import torch
    from flwr.app.message import remove_content_from_message
    from flwr.common.serde import message_to_proto
    from flwr.proto.message_pb2 import PullObjectResponse
    from flwr.proto.runtime_pb2 import PullAppMessagesResponse
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, get_object_tree

    from pflkit.flower import apps

    def content(loss: float):
        return apps.reply_content(apps.Reply({"model.w": torch.ones(2)}, {"loss": loss}))

    dead, alive = _reply(11, "to node 1", content(1.0)), _reply(10, "to node 0", content(2.0))
    contents = {k: v.deflate() for k, v in get_all_nested_objects(alive).items()}
    pulls = []

    class RuntimeApi:
        def PullMessages(self, request):
            pulls.append(sorted(request.message_ids))
            m = dead if len(pulls) == 1 else alive
            return PullAppMessagesResponse(messages_list=[message_to_proto(remove_content_from_message(m))],
                                           message_object_trees=[get_object_tree(m)])

        def PullObject(self, request):  # the dead node's objects never come; the live node's are there
            content = contents.get(request.object_id)
            return PullObjectResponse(object_found=True, object_available=content is not None,
                                      object_content=content or b"")

        def ConfirmMessageReceived(self, request):
            return None

    _, grid = _polling_grid(monkeypatch, RuntimeApi(), ["to node 0", "to node 1"])
    # 1 s: the first pull must begin before the timeout (it always ends past it), even on a busy machine
    replies = _send_and_receive(grid, timeout=1.0)
    assert replies is not None, "send_and_receive did not return"
    assert [m.metadata.src_node_id for m in replies] == [10]  # node 0's reply; node 1's stand-in goes to no one
    assert pulls == [["to node 0", "to node 1"], ["to node 0"]]  # the second pull began past the timeout
    got = _answered(replies, {0: 10, 1: 11}, timeout=1.0)
    assert list(got) == [0] and got[0].metrics == {"loss": 2.0}  # client 0 answered; client 1 did not


def test_registration_counts_flowers_stand_in_as_no_reply(monkeypatch):
    """A node whose info reply's objects never came (Flower's stand-in, sent from the SuperLink's node) is not
    registered and registration, over ``PollingGrid``, ends naming the count, not 'node <the SuperLink's id>
    failed'."""
    pytest.importorskip("flwr")
    from flwr.superlink.grid import http_grid

    from pflkit.flower import apps

    monkeypatch.setattr(http_grid, "pull_objects", http_grid.pull_objects)  # restored after the test
    superlink = 1

    def reply(node, to, error=None):
        return types.SimpleNamespace(metadata=types.SimpleNamespace(src_node_id=node, reply_to_message_id=to),
                                     has_error=lambda: error is not None, error=types.SimpleNamespace(reason=error),
                                     content={"info": {"num_clients": 2, "partition": 0}})

    class Grid:
        def get_node_ids(self):
            return [11, 12]

        def push_messages(self, messages):
            return ["to 11", "to 12"]

        def pull_messages(self, ids):
            return [reply(11, "to 11"), reply(superlink, "to 12", "Reply message objects are unavailable.")]

    monkeypatch.setattr(apps, "Message", lambda *a, **k: None)  # the fake grid needs no Flower messages
    with pytest.raises(apps.FederationError, match=r"only 1 of 2 nodes registered within 0.2 s"):
        apps.register(apps.PollingGrid(Grid()), timeout=0.2)
