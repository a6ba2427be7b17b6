"""A LocalCluster whose processes each run on a test host (tests/netfault/hosts.py).

`NetCluster` is node.launcher.LocalCluster with every process (`python -m node serve`)
started inside its host's network namespace (`ip netns exec NS ...`, through the
launcher's `command_prefix` hook) and listening on that host's address, so every byte
between processes crosses the test network, where iptables rules can cut it. The
processes register those addresses, so clients in the root namespace (the test
process) reach them over the bridge. `placement` maps node ids to host names; by
default "control" runs on host "c1", "control2" on "c2", ..., and storage node nI on
host nI.
"""

from __future__ import annotations

from node.launcher import LocalCluster
from tests.netfault.hosts import Host, Testbed


def default_placement(nodes: int, controls: int) -> dict[str, str]:
    placement = {"control": "c1"}
    placement.update({f"control{i}": f"c{i}" for i in range(2, controls + 1)})
    placement.update({f"n{i}": f"n{i}" for i in range(1, nodes + 1)})
    return placement


class NetCluster(LocalCluster):
    def __init__(self, data_dir: str, bed: Testbed, *, nodes: int, controls: int, metastore: str,
                 placement: dict[str, str] | None = None, expose_sessions: bool = True):
        super().__init__(data_dir, nodes=nodes, port=0, metastore=metastore, controls=controls,
                         expose_sessions=expose_sessions)
        self.bed = bed
        self.placement = placement or default_placement(nodes, controls)
        missing = [n for n in self.procs if self.placement.get(n) not in bed.hosts]
        if missing:
            raise ValueError(f"no test host for {missing} (placement {self.placement}, hosts {list(bed.hosts)})")
        for node_id, node in self.procs.items():
            node.listen = f"{self.host_of(node_id).ip}:0"

    def host_of(self, node_id: str) -> Host:
        return self.bed[self.placement[node_id]]

    def node_on(self, host_name: str) -> str:
        for node_id, name in self.placement.items():
            if name == host_name and node_id in self.procs:
                return node_id
        raise KeyError(host_name)

    def command_prefix(self, node_id: str) -> list[str]:
        return self.host_of(node_id).command([])

    @property
    def storage_ids(self) -> list[str]:
        return [n for n in self.procs if n not in self.control_ids]
