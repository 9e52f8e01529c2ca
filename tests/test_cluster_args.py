"""Both clusters take ``brokers=``; constructing one starts nothing (no JVM needed here)."""

from __future__ import annotations

import pytest

from epochguard.testing import ApacheKafkaCluster, EmbeddedCluster


def test_apache_cluster_takes_brokers_like_the_embedded_one() -> None:
    assert ApacheKafkaCluster(brokers=2).broker_ids == [0, 1]
    assert ApacheKafkaCluster().broker_ids == [0, 1, 2]
    assert EmbeddedCluster(brokers=2).broker_ids == [1, 2]


def test_num_brokers_still_works_with_a_deprecation_warning() -> None:
    with pytest.warns(DeprecationWarning, match="use brokers="):
        cluster = ApacheKafkaCluster(num_brokers=1)
    assert cluster.broker_ids == [0]


def test_bad_broker_counts_are_rejected() -> None:
    with pytest.raises(TypeError, match="not both"):
        ApacheKafkaCluster(brokers=2, num_brokers=2)
    with pytest.raises(ValueError, match="at least one broker"):
        ApacheKafkaCluster(brokers=0)


def test_embedded_port_range_is_checked() -> None:
    with pytest.raises(ValueError, match="3 consecutive ports"):
        EmbeddedCluster(brokers=3, port=65534)
    with pytest.raises(ValueError, match="consecutive ports"):
        EmbeddedCluster(brokers=1, port=0)


def test_racks_and_replica_selector_are_checked() -> None:
    from epochguard.testing.embedded.state import RACK_AWARE_REPLICA_SELECTOR

    with pytest.raises(ValueError, match="racks names broker 7"):
        EmbeddedCluster(brokers=2, racks={7: "a"})
    with pytest.raises(ValueError, match="non-empty string"):
        EmbeddedCluster(brokers=2, racks={1: ""})
    with pytest.raises(ValueError, match="only None"):
        EmbeddedCluster(brokers=2, replica_selector="com.example.Nearest")
    with pytest.raises(ValueError, match="racks names broker 3"):
        ApacheKafkaCluster(brokers=3, racks={3: "a"})
    with pytest.raises(ValueError, match="plain string"):
        ApacheKafkaCluster(brokers=3, racks={0: "a\nb=c"})
    with pytest.raises(ValueError, match="Java class name"):
        ApacheKafkaCluster(brokers=3, replica_selector="a b")
    EmbeddedCluster(brokers=2, racks={1: "a", 2: "b"}, replica_selector=RACK_AWARE_REPLICA_SELECTOR)
    ApacheKafkaCluster(brokers=2, racks={0: "a"}, replica_selector=RACK_AWARE_REPLICA_SELECTOR)
