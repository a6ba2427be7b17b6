"""Chain placement: which storage nodes hold each new partition, and which one leads.

Pure function, no I/O. Members of a chain are distinct nodes; across the cluster the
number of replicas and the number of heads per node are kept as even as possible
(greedy: the least-loaded nodes first, ties broken by a cursor that stripes chains around
the ring of node ids, and the head chosen in each chain as the member with fewest heads;
deterministic for the same input).
"""

from __future__ import annotations

from collections import Counter

from sms.errors import NotEnoughNodes


def place(nodes: list[str], partitions: int, replication_factor: int,
          replicas_per_node: Counter | None = None, heads_per_node: Counter | None = None) -> list[tuple[str, ...]]:
    """Members (head first) for each of `partitions` new chains."""
    nodes = sorted(set(nodes))
    if replication_factor > len(nodes):
        raise NotEnoughNodes(f"replication factor {replication_factor} needs {replication_factor} storage nodes; "
                             f"{len(nodes)} are live")
    load = Counter(replicas_per_node or {})
    heads = Counter(heads_per_node or {})
    index = {n: i for i, n in enumerate(nodes)}
    cursor = 0          # stripes chains around the ring, so ties spread evenly
    chains = []
    for _ in range(partitions):
        def ring(n: str) -> int:
            return (index[n] - cursor) % len(nodes)
        members = sorted(nodes, key=lambda n: (load[n], ring(n)))[:replication_factor]
        head = min(members, key=lambda n: (heads[n], ring(n)))
        chain = (head, *(n for n in members if n != head))
        for n in chain:
            load[n] += 1
        heads[head] += 1
        cursor = (index[members[-1]] + 1) % len(nodes)
        chains.append(chain)
    return chains
