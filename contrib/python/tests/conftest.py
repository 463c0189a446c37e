"""Two real processes: the test is one peer, a forked child running a scenario the other."""
import multiprocessing
import os
import traceback

import pytest

_mp = multiprocessing.get_context("fork")


def _child(scenario, conn, args):
    import xfer
    try:
        with xfer.Context() as ctx:
            with ctx.listen("127.0.0.1:0") as lst:
                conn.send(lst.port)
                ep = lst.accept(timeout=20)
            scenario(ctx, ep, conn, *args)
            ep.close()
        conn.send(("ok", None))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()
        os._exit(0)


class Peer:
    """A child process that listens, accepts one connection and runs scenario(ctx, ep, conn,
    *args); the test connects to it with connect()."""

    def __init__(self, scenario, *args):
        self.conn, child = _mp.Pipe()
        self.proc = _mp.Process(target=_child, args=(scenario, child, args), daemon=True)
        self.proc.start()
        child.close()
        assert self.conn.poll(20), "the peer did not start listening"
        self.port = self.conn.recv()

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    def send(self, obj):
        self.conn.send(obj)

    def recv(self, timeout=30):
        assert self.conn.poll(timeout), "no word from the peer"
        return self.conn.recv()

    def finish(self, timeout=30):
        """The scenario's outcome: fails the test with the child's traceback."""
        word = self.recv(timeout)
        while not (isinstance(word, tuple) and word[:1] in (("ok",), ("error",))):
            word = self.recv(timeout)
        self.proc.join(timeout)
        assert word[0] == "ok", f"the peer failed:\n{word[1]}"


@pytest.fixture
def peer():
    made = []

    def start(scenario, *args):
        p = Peer(scenario, *args)
        made.append(p)
        return p
    yield start
    for p in made:
        if p.proc.is_alive():
            p.proc.kill()
            p.proc.join(5)


@pytest.fixture(autouse=True)
def _environment(monkeypatch):
    monkeypatch.setenv("XFER_TRANSPORTS", os.environ.get("XFERTEST_TRANSPORT", "tcp"))
    monkeypatch.setenv("XFER_BOOTSTRAP_TIMEOUT", "5s")
