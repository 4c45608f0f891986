"""A two-node Ray test cluster on this machine (Ray's own `cluster_utils`: two raylets, each a node with its own id
and resources), to try `--placement ray` and `placement.trainer: ray` before a real cluster:

    python examples/clusters/two_nodes_here.py --cpus-per-node 1 &     # prints the address, runs until stopped
    hrl train --recipe demo --iterations 1 --placement ray -c placement.address=ADDRESS \\
        -c placement.trainer=ray -c trainer.nproc=2

Ctrl-C or SIGTERM shuts both nodes down."""

from __future__ import annotations

import argparse
import signal
import threading


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--cpus-per-node", type=int, default=1, help="logical CPUs Ray gives each node")
    args = ap.parse_args()
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": args.cpus_per_node, "include_dashboard": False})
    for _ in range(args.nodes - 1):
        cluster.add_node(num_cpus=args.cpus_per_node)
    cluster.wait_for_nodes()
    print(f"ADDRESS={cluster.address}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    cluster.shutdown()


if __name__ == "__main__":
    main()
