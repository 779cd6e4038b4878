"""Ranks from the inventory (operations.model.topology) and per-rank validation, without hosts."""
from dataclasses import dataclass, field

import pytest

from operations import server

from operations.model import topology
from operations.model.config import ServerConfig
from operations.errors import ConfigError


@dataclass
class H:
    name: str
    data: dict = field(default_factory=dict)


def group(*names, **extra):
    return [H(n, {"specops_group": "g", **extra.get(n, {})}) for n in names]


CFG = ServerConfig(name="mn", args={"model_path": "m", "tp_size": 12, "port": 30000})


def test_ranks_follow_inventory_order_and_rank_0_is_the_rendezvous():
    hosts = group("a", "b", "c") + [H("solo")]
    ranks = [topology.rank_of(h, hosts) for h in hosts[:3]]
    assert [r.rank for r in ranks] == [0, 1, 2] and {r.nnodes for r in ranks} == {3}
    assert {r.dist_init_addr for r in ranks} == {"a:20000"}
    assert topology.rank_of(hosts[3], hosts) is None
    cfg = topology.for_rank(CFG, ranks[2])
    assert (cfg.args["nnodes"], cfg.args["node_rank"], cfg.args["dist_init_addr"]) == (3, 2, "a:20000")
    assert cfg.config_hash != topology.for_rank(CFG, ranks[1]).config_hash  # each rank its own identity


def test_explicit_ranks_and_dist_host_override_inventory_order():
    hosts = group("a", "b")
    hosts[0].data["specops_rank"], hosts[1].data["specops_rank"] = 2, 1
    hosts.append(H("c", {"specops_group": "g", "specops_rank": 0, "specops_dist_host": "10.0.0.3",
                         "specops_dist_port": 5000}))
    assert topology.rank_issues("g", hosts) == []
    assert [topology.rank_of(h, hosts).rank for h in hosts] == [2, 1, 0]
    assert topology.rank_of(hosts[0], hosts).dist_init_addr == "10.0.0.3:5000"


@pytest.mark.parametrize("ranks, message", [((0, 0, 1), "not 0..2"), ((0, 1, None), "set on every member")])
def test_bad_explicit_ranks_are_reported(ranks, message):
    hosts = [H(n, {"specops_group": "g", **({"specops_rank": r} if r is not None else {})})
             for n, r in zip("abc", ranks)]
    (issue,) = topology.rank_issues("g", hosts)
    assert message in issue.message


def test_check_inventory_lists_every_rank_problem_before_anything_runs():
    hosts = [H(n, {"specops_group": "g", "gpu_count": 2}) for n in "ab"]
    with pytest.raises(ConfigError) as err:
        server.check_inventory(ServerConfig(name="mn", args={**CFG.args, "nnodes": 3}), hosts)
    text = str(err.value)
    assert "nnodes: 3 but inventory group g has 2 host(s)" in text
    assert "[a]" in text and "[b]" in text and "host has 2" in text  # 12 GPUs over 2 nodes needs 6 per node


def test_nnodes_above_one_without_a_group_is_an_error():
    with pytest.raises(ConfigError, match="specops_group"):
        server.check_inventory(ServerConfig(name="mn", args={**CFG.args, "nnodes": 2}), [H("solo")])
