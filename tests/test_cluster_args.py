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
