"""Two Ray nodes on this host - a head and a second raylet joined to it (Ray's own
ray.cluster_utils.Cluster, what `ray start --address` does, each node its own raylet and
object store) - and an actor on each: tensors cross between the nodes over xfer, both ways."""
import os

import pytest
import ray
from ray._private.utils import get_ray_address_file
from ray.cluster_utils import Cluster

from test_ray import MiB, Receiver, Sender


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    # Cluster records the head's address in Ray's default temp directory (ray_current_cluster)
    # even though each node has a temp_dir of its own; where Ray never ran, that directory
    # does not exist yet
    os.makedirs(os.path.dirname(get_ray_address_file(None)), exist_ok=True)
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "resources": {"first": 4},
        "temp_dir": str(tmp_path_factory.mktemp("ray")), "include_dashboard": False})
    cluster.add_node(num_cpus=2, resources={"second": 4})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    yield
    ray.shutdown()
    cluster.shutdown()


def node_of(actor):
    return ray.get(actor.__ray_call__.remote(
        lambda self: ray.get_runtime_context().get_node_id()))


@pytest.mark.parametrize("n", [4 << 10, 64 * MiB], ids=["4KiB", "64MiB"])
def test_tensors_cross_between_two_raylets_both_ways(two_nodes, n):
    s1 = Sender.options(resources={"first": 1}).remote()
    r1 = Receiver.options(resources={"first": 1}).remote()
    s2 = Sender.options(resources={"second": 1}).remote()
    r2 = Receiver.options(resources={"second": 1}).remote()
    assert node_of(s1) == node_of(r1) != node_of(s2) == node_of(r2)
    assert ray.get(r2.check.remote(s1.bytes.remote(n, 21), n, 21), timeout=120)
    assert ray.get(r1.check.remote(s2.bytes.remote(n, 22), n, 22), timeout=120)
    for a in (s1, r1, s2, r2):
        ray.kill(a)
