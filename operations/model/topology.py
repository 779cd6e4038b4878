"""Multi-node groups: which hosts serve one model together, and each one's rank, from the inventory.

Hosts with the same host data ``specops_group`` form a group. Ranks follow inventory order, or host data
``specops_rank`` when every member sets it (0..N-1, each once). Every rank gets ``nnodes`` = N, its
``node_rank`` and ``dist_init_addr`` = rank 0's address (host data ``specops_dist_host``, else ``ssh_hostname``,
else its inventory name) and port (host data ``specops_dist_port``, default 20000), unless the config sets
``dist-init-addr`` itself. The same inventory always gives the same ranks.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from operations.errors import Issue
from operations.model.server_config import ServerConfig
from operations.model.validation import HostContext, validate

DIST_PORT = 20000


@dataclass(frozen=True)
class Rank:
    group: str
    rank: int
    hosts: tuple[str, ...]  # inventory names, by rank
    dist_host: str
    dist_port: int

    @property
    def nnodes(self) -> int:
        return len(self.hosts)

    @property
    def leader(self) -> str:
        return self.hosts[0]

    @property
    def dist_init_addr(self) -> str:
        return f"{self.dist_host}:{self.dist_port}"


def members(group: str, hosts) -> list:
    """The group's hosts, by rank."""
    found = [h for h in hosts if h.data.get("specops_group") == group]
    if found and all(h.data.get("specops_rank") is not None for h in found):
        return sorted(found, key=lambda h: int(h.data.get("specops_rank")))
    return found


def rank_issues(group: str, hosts) -> list[Issue]:
    found = [h for h in hosts if h.data.get("specops_group") == group]
    explicit = [h for h in found if h.data.get("specops_rank") is not None]
    if not explicit:
        return []
    if len(explicit) != len(found):
        missing = ", ".join(h.name for h in found if h not in explicit)
        return [Issue("specops_rank", f"group {group}: set on every member or none (missing on {missing})")]
    ranks = sorted(str(h.data.get("specops_rank")) for h in found)
    if ranks != sorted(str(i) for i in range(len(found))):
        return [Issue("specops_rank", f"group {group}: ranks {', '.join(ranks)} are not 0..{len(found) - 1}, "
                                      f"each once")]
    return []


def rank_of(host, hosts) -> Rank | None:
    """``host``'s rank in its group, or None when it is in no group. Call ``rank_issues`` first."""
    group = host.data.get("specops_group")
    if not group:
        return None
    ordered = members(group, hosts)
    leader = ordered[0]
    dist_host = leader.data.get("specops_dist_host") or leader.data.get("ssh_hostname") or leader.name
    return Rank(group, ordered.index(host), tuple(h.name for h in ordered), str(dist_host),
                int(leader.data.get("specops_dist_port") or DIST_PORT))


def nnodes_issues(cfg: ServerConfig, rank: Rank | None) -> list[Issue]:
    """The config's own nnodes against the group (before ``for_rank`` overrides it)."""
    declared = cfg.args.get("nnodes")
    if rank is None:
        if isinstance(declared, int) and declared > 1 and not cfg.args.get("dist_init_addr"):
            return [Issue("nnodes", f"{declared} needs a multi-node group: give its hosts the same host data "
                                    f"specops_group")]
        return []
    if declared is not None and declared != rank.nnodes:
        return [Issue("nnodes", f"{declared} but inventory group {rank.group} has {rank.nnodes} host(s)")]
    return []


def for_rank(cfg: ServerConfig, rank: Rank | None) -> ServerConfig:
    """The config as this rank runs it (nnodes, node_rank, dist_init_addr filled in)."""
    if rank is None:
        return cfg
    args = {**cfg.args, "nnodes": rank.nnodes, "node_rank": rank.rank}
    args.setdefault("dist_init_addr", rank.dist_init_addr)
    if args["dist_init_addr"] is None:
        args["dist_init_addr"] = rank.dist_init_addr
    return replace(cfg, args=args)


def rank_config_issues(cfg: ServerConfig, on_host, hosts, gpu_count) -> list:
    """Validation of ``cfg`` as ``on_host`` would run it (its rank filled in when it is in a group)."""
    rank = rank_of(on_host, hosts)
    ctx = HostContext(on_host.name, gpu_count, rank.nnodes if rank else None)
    return nnodes_issues(cfg, rank) + validate(for_rank(cfg, rank), ctx)
