"""Chain placement: which storage nodes hold each new partition, and which one leads.

Pure function, no I/O. Members of a chain are distinct nodes; across the cluster the
number of replicas and the number of heads per node are kept as even as possible
(greedy: least-loaded first, ties broken by node id so placement is deterministic).
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
    chains = []
    for _ in range(partitions):
        members = sorted(nodes, key=lambda n: (load[n], heads[n], n))[:replication_factor]
        head = min(members, key=lambda n: (heads[n], load[n], n))
        rest = [n for n in members if n != head]
        chain = (head, *rest)
        for n in chain:
            load[n] += 1
        heads[head] += 1
        chains.append(chain)
    return chains
