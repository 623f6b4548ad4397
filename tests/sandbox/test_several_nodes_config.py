"""`[[sandbox_nodes]]` beside or instead of `[sandbox_node]`: every entry is a node, paths
resolve like the rest of the config, and a bad entry is named in the error."""

from __future__ import annotations

import pytest

from model_gateway.gateway.config import ConfigError, parse_config
from model_gateway.gateway.ops.summary import startup_summary

TWO_NODES = """
[[sandbox_nodes]]
url = "http://10.0.0.1:8091"
secret_file = "secrets/node-a"
max_concurrent = 2

[[sandbox_nodes]]
url = "http://10.0.0.2:8091"
"""


def test_entries_beside_the_single_node_are_all_nodes(tmp_path):
    config = parse_config("[sandbox_node]\nspawn = true\n" + TWO_NODES, base_dir=tmp_path)
    nodes = config.sandbox_node_entries()
    assert [(name, node.url, node.max_concurrent) for name, node in nodes] == [
        ("sandbox_node", "http://127.0.0.1:8091", 4),
        ("sandbox_nodes[0]", "http://10.0.0.1:8091", 2),
        ("sandbox_nodes[1]", "http://10.0.0.2:8091", 4),
    ]
    assert config.path(nodes[1][1].secret_file) == tmp_path / "secrets" / "node-a"
    assert config.path(nodes[2][1].secret_file) == tmp_path / "data" / "sandbox-secret"
    assert startup_summary(config)[-4:] == [
        "sandbox_node http://127.0.0.1:8091: 4 slots (run by this gateway: spawn = true)",
        "sandbox_nodes[0] http://10.0.0.1:8091: 2 slots",
        "sandbox_nodes[1] http://10.0.0.2:8091: 4 slots",
        "sandbox capacity: 10 slots on 3 nodes",
    ]


def test_entries_alone_are_the_nodes():
    config = parse_config(TWO_NODES)
    assert config.sandbox_node is None
    assert [name for name, _ in config.sandbox_node_entries()] == [
        "sandbox_nodes[0]",
        "sandbox_nodes[1]",
    ]


URL = 'url = "http://a:1"\n'
BAD_ENTRIES = [
    ("max_concurrent = 2\n", "missing required field `url` - at `sandbox_nodes[2]`"),
    ('url = "ftp://x"\n', "not 'ftp://x' - at `sandbox_nodes[2]`"),
    (URL + "max_concurrent = 0\n", "max_concurrent must be at least 1 - at `sandbox_nodes[2]`"),
    (URL + "spawn = true\n", "unknown key `sandbox_nodes[2].spawn`"),
    (URL + "max_concurent = 1\n", "unknown key `sandbox_nodes[2].max_concurent`"),
    (URL + 'max_concurrent = "2"\n', "at `sandbox_nodes[2].max_concurrent`"),
]


@pytest.mark.parametrize(("entry", "named"), BAD_ENTRIES)
def test_a_bad_entry_is_named(entry, named):
    with pytest.raises(ConfigError) as error:
        parse_config(TWO_NODES + "[[sandbox_nodes]]\n" + entry)
    assert named in str(error.value)


def test_the_same_node_twice_is_refused():
    """Its slots would count twice: the gateway would send it more than it runs."""
    twice = '[sandbox_node]\nurl = "http://10.0.0.2:8091/"\n' + TWO_NODES
    with pytest.raises(ConfigError) as error:
        parse_config(twice)
    assert "sandbox_nodes[1].url repeats sandbox_node.url" in str(error.value)
