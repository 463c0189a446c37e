"""Batches and notifications from Python, between two real processes: prepared descriptor
lists (sequences and uint64 arrays) for put and get, a notification only after the data -
taken by handler, by polling and as an async iterator - deadlines and cancel (a batch that
ends early never notifies, and says how much landed), and errors with their reason."""
import asyncio
import time

import numpy as np
import pytest

import xfer

CANCELED, TIMEOUT, OUT_OF_RANGE, PEER_CLOSED = -10, -8, -16, -20
BLOCK, NBLOCKS = 4096, 128
REGION = BLOCK * NBLOCKS


def target(ctx, ep, conn, how):
    """Register REGION, hand over its key, then take the test's notifications `how`
    ("poll", "handler", "async"); for each, check at that moment that the batch it closes has
    landed (block i holds i % 251 + the post's number) and report what came."""
    region = np.zeros(REGION, dtype=np.uint8)
    region[:] = np.arange(REGION) % 253          # what the test's gets read
    got = []

    def check(msg):
        post = int(msg)
        blocks = region.reshape(NBLOCKS, BLOCK)
        want = (np.arange(NBLOCKS) % 251 + post) % 256
        assert (blocks[:, 0] == want).all() and (blocks[:, -1] == want).all(), \
            f"notification {post} came before its data"
        got.append(post)

    with ctx.register(region) as mem:
        ep.tag_send(1, mem.pack()).wait(20)
        want = conn.recv()                       # how many notifications to expect
        if how == "handler":
            ctx.on_notify(lambda e, msg: (e is ep or pytest.fail("endpoint")) and check(msg))
            while len(got) < want:
                ctx.progress()
        elif how == "poll":
            while len(got) < want:
                msg = ep.notify_poll()
                if msg is not None:
                    check(msg)
        else:
            async def take():
                async for msg in ep.notifications():
                    check(msg)
                    if len(got) == want:
                        return
            asyncio.run(asyncio.wait_for(take(), 60))
        conn.send(got)
        while not conn.poll(0):                 # serve the test's gets until told
            ctx.progress()
        conn.recv()


def connect_and_key(ctx, p):
    ep = ctx.connect(p.address)
    blob = bytearray(4096)
    n = ctx.tag_recv(blob, 1, ep=ep).wait(20)
    return ep, ep.unpack_rkey(bytes(blob[:n]))


@pytest.mark.parametrize("how", ["poll", "handler", "async"])
def test_put_batches_notify_after_their_data(peer, how):
    p = peer(target, how)
    posts = 5
    with xfer.Context() as ctx:
        ep, rkey = connect_and_key(ctx, p)
        src = np.zeros(REGION * posts, dtype=np.uint8)
        with ctx.register(src) as mem:
            batches = []
            for post in range(posts):
                blocks = src[post * REGION:(post + 1) * REGION].reshape(NBLOCKS, BLOCK)
                blocks[:] = ((np.arange(NBLOCKS) % 251 + post) % 256)[:, None]
                if post % 2:                     # descriptors as a uint64 array
                    d = np.zeros((NBLOCKS, 3), dtype=np.uint64)
                    d[:, 0] = post * REGION + np.arange(NBLOCKS) * BLOCK
                    d[:, 1] = np.arange(NBLOCKS) * BLOCK
                    d[:, 2] = BLOCK
                else:                            # as a sequence of triples
                    d = [(post * REGION + i * BLOCK, i * BLOCK, BLOCK) for i in range(NBLOCKS)]
                batches.append(ep.batch("put", mem, rkey, d))
            assert batches[0].count == NBLOCKS and batches[0].op == "put"
            p.send(posts)
            for post, b in enumerate(batches):  # one at a time: each overwrites the region
                req = b.post(notify=str(post).encode(), timeout=20)
                assert req.wait(20) is None and req.landed == NBLOCKS
            assert p.recv(60) == list(range(posts))
            for b in batches:
                b.destroy()
        p.send("done")
        ep.close()
    p.finish()


def test_get_batch_reads_the_peer_s_blocks(peer):
    p = peer(target, "poll")
    with xfer.Context() as ctx:
        ep, rkey = connect_and_key(ctx, p)
        p.send(0)
        assert p.recv() == []
        dst = np.zeros(REGION, dtype=np.uint8)
        with ctx.register(dst) as mem:
            # every other block, reversed: block i of ours is block NBLOCKS-1-i of the peer's
            d = [(i * BLOCK, (NBLOCKS - 1 - i) * BLOCK, BLOCK) for i in range(0, NBLOCKS, 2)]
            with ep.batch("get", mem, rkey, d) as b:
                req = b.post()
                req.wait(20)
                assert req.landed == len(d)
            want = np.arange(REGION) % 253
            for i in range(NBLOCKS):
                got = dst[i * BLOCK:(i + 1) * BLOCK]
                if i % 2 == 0:
                    j = NBLOCKS - 1 - i
                    assert (got == want[j * BLOCK:(j + 1) * BLOCK]).all(), i
                else:
                    assert (got == 0).all(), i
        p.send("done")
        ep.close()
    p.finish()


def late_notes(ctx, ep, conn):
    """Hand over a 64 MiB key; report the notifications that came within the seconds told."""
    region = np.zeros(64 << 20, dtype=np.uint8)
    with ctx.register(region) as mem:
        ep.tag_send(1, mem.pack()).wait(20)
        until = time.monotonic() + conn.recv()
        got = []
        while time.monotonic() < until:
            msg = ep.notify_poll()
            if msg is not None:
                got.append(msg)
        conn.send(got)
        conn.recv()


def test_a_cancelled_or_late_batch_never_notifies_and_says_what_landed(peer):
    p = peer(late_notes)
    with xfer.Context() as ctx:
        ep, rkey = connect_and_key(ctx, p)
        src = np.ones(64 << 20, dtype=np.uint8)
        with ctx.register(src) as mem:
            d = np.zeros((2048, 3), dtype=np.uint64)    # 2,048 x 4 MiB over the same 64 MiB
            d[:, 0] = d[:, 1] = (np.arange(2048) % 16) * (4 << 20)
            d[:, 2] = 4 << 20
            p.send(8.0)
            outcomes = []
            with ep.batch("put", mem, rkey, d) as b:
                # the deadline travels with a batch and stops a target that moves the data
                # itself (shm); a cancel ends it here at once
                reqs = [b.post(notify=b"cancelled", timeout=2),
                        b.post(notify=b"late", timeout=0.001)]
                reqs[0].cancel()
                for r in reqs:
                    try:
                        r.wait(60)
                        outcomes.append("ok")
                    except xfer.XferError as e:
                        assert e.status in (CANCELED, TIMEOUT), e
                        assert r.landed < 2048
                        outcomes.append("early")
            # what was on its way when they ended may still land: the flush waits for it,
            # and then the memory is free to go
            ep.flush().wait(30)
            notes = p.recv(30)
            for r, what, outcome in zip(reqs, (b"cancelled", b"late"), outcomes):
                assert (what in notes) == (outcome == "ok"), (what, outcome, notes)
            assert "early" in outcomes, "8 GiB cannot have landed within 1 ms"
        p.send("done")
        ep.close()
    p.finish()


def test_batch_errors_carry_their_reason(peer):
    p = peer(target, "poll")
    with xfer.Context() as ctx:
        ep, rkey = connect_and_key(ctx, p)
        p.send(0)
        p.recv()
        src = np.zeros(BLOCK, dtype=np.uint8)
        with ctx.register(src) as mem:
            with pytest.raises(xfer.XferError) as e:
                ep.batch("put", mem, rkey, [(0, REGION - 10, 20)])
            assert e.value.status == OUT_OF_RANGE and e.value.reason, e.value
            with pytest.raises(ValueError):
                ep.batch("copy", mem, rkey, [])
            with pytest.raises(ValueError):
                ep.batch("put", mem, rkey, np.zeros((4, 2), dtype=np.uint64))
            b = ep.batch("put", mem, rkey, [(0, 0, BLOCK)])
            with pytest.raises(ValueError):
                b.post(timeout=-1.5)
            b.destroy()
            with pytest.raises(xfer.XferError):
                b.post()
        p.send("done")
        ep.close()
    p.finish()


def acting_handler(ctx, ep, conn):
    """A notification handler that posts and closes from inside itself, as xfer.h allows (it
    may post, close and progress, not wait): each notification is sent back with tag 2; the
    one that says b"close" closes the endpoint in order."""
    region = np.zeros(REGION, dtype=np.uint8)
    replies, closed = [], []

    def handler(e, msg):
        if msg == b"close":
            e.close()
            closed.append(e)
        else:
            replies.append(e.tag_send(2, msg))

    with ctx.register(region) as mem:
        ep.tag_send(1, mem.pack()).wait(20)
        ctx.on_notify(handler)
        deadline = time.monotonic() + 30
        while not closed and time.monotonic() < deadline:
            ctx.progress()
        assert closed == [ep], "the close notification did not close ep"
        for r in replies:                      # posted before the close: it delivers them
            r.wait(20)
        conn.send(len(replies))


def test_a_notification_handler_may_post_and_close(peer):
    p = peer(acting_handler)
    with xfer.Context() as ctx:
        ep, rkey = connect_and_key(ctx, p)
        src = np.ones(BLOCK, dtype=np.uint8)
        with ctx.register(src) as mem, ep.batch("put", mem, rkey, [(0, 0, BLOCK)]) as b:
            for i in range(5):
                assert b.post(notify=str(i).encode(), timeout=20).wait(20) is None
                buf = bytearray(16)
                n = ctx.tag_recv(buf, 2, ep=ep).wait(20)
                assert bytes(buf[:n]) == str(i).encode()
            assert b.post(notify=b"close", timeout=20).wait(20) is None
        # the peer closed in order: what waits on this endpoint ends with PEER_CLOSED
        with pytest.raises(xfer.XferError) as e:
            ctx.tag_recv(bytearray(16), 3, ep=ep).wait(20)
        assert e.value.status == PEER_CLOSED, e.value
        assert p.recv(30) == 5
        ep.close(force=True)
    p.finish()
