"""Ray's failure monitor aborts a transfer that outlives RAY_rdt_fetch_fail_timeout_milliseconds
(test/ray.sh cuts it to 1.5 s for this file alone): xfer's transport stops the receiver's gets
when Ray calls abort_transport, the receive fails, and both actors go on working."""
import os
import time

import pytest
import ray

from test_ray import GiB, MiB, Receiver, Sender, big_over_tcp, wait_until


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    assert os.environ.get("RAY_rdt_fetch_fail_timeout_milliseconds"), \
        "run by test/ray.sh, which sets Ray's fetch timeout"
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
             _temp_dir=str(tmp_path_factory.mktemp("ray")))
    yield
    ray.shutdown()


def test_ray_aborts_a_transfer_past_its_timeout_and_both_actors_go_on(cluster):
    s = Sender.options(**big_over_tcp()).remote()
    r = Receiver.options(**big_over_tcp()).remote()
    ref = s.zeros.remote(4 * GiB)
    assert wait_until(lambda: ray.get(s.live.remote()) == 1)
    started = time.monotonic()
    with pytest.raises(ray.exceptions.RayTaskError) as e:
        ray.get(r.length.remote(ref), timeout=120)
    took = time.monotonic() - started
    print(f"the receive failed after {took:.1f} s: {type(e.value).__name__}")
    # Ray's own wait gave up first; what matters is that the gets stopped there: the
    # transport's receive ended by Ray's abort, not by completing in the background
    # (Ray may abort before the receiver's actor began the receive: that too ends aborted)
    assert wait_until(lambda: ray.get(r.outcomes.remote())["aborted"] == 1), \
        f"the receiver's outcomes: {ray.get(r.outcomes.remote())}"
    assert ray.get(r.outcomes.remote()) == {"completed": 0, "aborted": 1, "failed": 0}
    # neither side is wedged: the receiver takes a small object from the same sender, which
    # still holds the big one until Ray collects it
    assert ray.get(r.check.remote(s.bytes.remote(MiB, 3), MiB, 3), timeout=60)
    del ref
    assert wait_until(lambda: ray.get(s.live.remote()) == 0)
