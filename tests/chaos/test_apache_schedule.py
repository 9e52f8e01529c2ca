"""The real-Kafka schedule flavour (``generate_apache``): seeded, frozen, one partition, only
the faults ApacheKafkaCluster can apply, and short enough for 30 runs in minutes."""

from __future__ import annotations

import time

import attrs
import pytest

from epochguard.testing.chaos import schedule as sch
from epochguard.testing.chaos.apache import replay_code, run_apache_schedule
from epochguard.testing.chaos.schedule import (
    APACHE_HEAVY_MAX,
    APACHE_STEPS,
    DeleteRecords,
    Elect,
    Produce,
    ScheduleError,
    StartBroker,
    StopBroker,
    generate,
    generate_apache,
)

SEEDS = range(500)


def _heavy(step: sch.Step) -> bool:
    return isinstance(step, StopBroker | StartBroker) or (isinstance(step, Elect) and step.unclean)


def test_the_same_seed_gives_the_same_frozen_schedule_and_others_differ() -> None:
    s = generate_apache(3)
    assert s == generate_apache(3)
    assert len({generate_apache(seed) for seed in range(30)}) == 30
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        s.seed = 4  # type: ignore[misc]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        s.steps[0].pick = 1  # type: ignore[union-attr]
    assert eval(repr(s), vars(sch)) == s


def test_one_partition_one_consumer_committing_to_its_group() -> None:
    shapes = {(s.partitions, s.members, s.offsets) for s in map(generate_apache, SEEDS)}
    assert shapes == {(1, 1, "group")}
    assert {s.policy for s in map(generate_apache, SEEDS)} == {"rewind", "raise"}
    assert generate_apache(5, policy="raise").policy == "raise"


def test_only_the_faults_real_kafka_allows_and_every_one_of_them() -> None:
    kinds: set[object] = set()
    for seed in SEEDS:
        for step in generate_apache(seed).steps:
            assert isinstance(step, APACHE_STEPS), step
            assert getattr(step, "partition", 0) == 0, step
            if isinstance(step, Produce):
                assert step.batch == 1, step  # one record per acks=1 request on real Kafka
            kinds.add(
                ("unclean" if step.unclean else "clean") if isinstance(step, Elect) else type(step)
            )
    assert kinds == {"clean", "unclean", *(t for t in APACHE_STEPS if t is not Elect)}
    fractions = {
        step.fraction
        for seed in SEEDS
        for step in generate_apache(seed).steps
        if isinstance(step, DeleteRecords)
    }
    assert fractions == {0.25, 0.5, 1.0}


def test_every_schedule_elects_uncleanly_and_stops_brokers_at_most_three_times() -> None:
    for seed in SEEDS:
        s = generate_apache(seed)
        assert len(s.steps) == 8
        assert s.unclean, s
        assert sum(map(_heavy, s.steps)) <= APACHE_HEAVY_MAX, s
        long = generate_apache(seed, steps=30)
        assert len(long.steps) == 30
        assert sum(map(_heavy, long.steps)) <= APACHE_HEAVY_MAX, long
        clean = generate_apache(seed, unclean=False)
        assert not clean.unclean, clean
        assert not any(isinstance(step, Elect) and step.unclean for step in clean.steps)


def test_the_unclean_election_a_schedule_needs_is_drawn_when_every_step_is_heavy() -> None:
    # One step: whatever was drawn becomes the unclean election.
    for seed in range(50):
        (step,) = generate_apache(seed, steps=1).steps
        assert isinstance(step, Elect) and step.unclean


@pytest.mark.parametrize("steps", [0, -1, True, 2.0])
def test_a_bad_step_count_is_refused_by_name(steps: object) -> None:
    with pytest.raises(ScheduleError, match="steps must be an int >= 1"):
        generate_apache(0, steps=steps)  # type: ignore[arg-type]


def test_the_real_kafka_runner_refuses_a_schedule_it_cannot_run() -> None:
    several = generate(1, partitions=2, members=1)
    with pytest.raises(ValueError, match="one partition and one consumer"):
        run_apache_schedule(several, None)  # type: ignore[arg-type]
    group = generate_apache(1).replace(members=2)
    with pytest.raises(ValueError, match="one partition and one consumer"):
        run_apache_schedule(group, None)  # type: ignore[arg-type]


def test_replay_code_names_the_real_kafka_runner() -> None:
    s = generate_apache(11, steps=3)
    code = replay_code(s)
    assert "run_apache_schedule" in code and "ApacheKafkaCluster" in code
    assert repr(s) in code
    namespace: dict[str, object] = {}
    exec(code.split("with ApacheKafkaCluster")[0], namespace)  # the imports only
    assert eval(repr(s), namespace) == s


def test_transactional_real_kafka_schedules_lose_a_marker_each() -> None:
    txn_kinds: set[object] = set()
    for seed in SEEDS:
        s = generate_apache(seed, transactions=True)
        assert (s.partitions, s.members, s.transactions) == (1, 1, 1)
        for step in s.steps:
            assert isinstance(step, sch.APACHE_TXN_STEPS), step
            txn_kinds.add(type(step))
        # At least one unclean election takes the marker recipe (pick % 3 != 2).
        assert any(isinstance(x, Elect) and x.unclean and x.pick % 3 != 2 for x in s.steps)
        assert sum(_heavy(x) for x in s.steps) <= APACHE_HEAVY_MAX
        assert generate_apache(seed) == generate_apache(seed, transactions=False)
    assert {sch.TxnProduce, sch.TxnEnd} <= txn_kinds


def test_network_schedules_mix_proxy_faults_into_the_real_kafka_steps() -> None:
    net_kinds: set[str] = set()
    restarts_after_blackhole = 0
    for seed in SEEDS:
        s = generate_apache(seed, network=True)
        assert (s.partitions, s.members, s.offsets) == (1, 1, "group")
        assert s.network and s.unclean, s
        assert sum(_heavy(x) for x in s.steps) <= APACHE_HEAVY_MAX
        blackholed = False
        for step in s.steps:
            assert isinstance(step, sch.APACHE_NET_STEPS), step
            if isinstance(step, sch.NetFault):
                net_kinds.add(step.kind)
                blackholed = blackholed or step.kind == "blackhole"
            elif blackholed and isinstance(step, sch.RestartConsumer):
                restarts_after_blackhole += 1
        # The schedules without network faults stay what they were.
        assert not generate_apache(seed).network
        assert generate_apache(seed) == generate_apache(seed, network=False)
    assert net_kinds == set(sch.NET_FAULT_KINDS)
    # A consumer created while a bootstrap address is half-open is in the schedules too.
    assert restarts_after_blackhole >= 10
    assert generate_apache(7, network=True) == generate_apache(7, network=True)
    assert generate_apache(7, network=True).injected_delay_s == sum(
        x.delay_s for x in generate_apache(7, network=True).steps if isinstance(x, sch.NetFault)
    )


def test_network_and_transactions_are_not_drawn_together() -> None:
    with pytest.raises(ScheduleError, match="network and transactions"):
        generate_apache(0, network=True, transactions=True)


def test_a_network_schedule_needs_the_proxy_the_cluster_was_started_with() -> None:
    s = generate_apache(2, network=True)
    with pytest.raises(ValueError, match="needs proxy="):
        run_apache_schedule(s, None)  # type: ignore[arg-type]


def test_replay_code_of_a_network_schedule_puts_the_proxy_in_front() -> None:
    s = generate_apache(11, network=True)
    code = replay_code(s)
    assert "FaultProxy() as proxy" in code and "fault_proxy=proxy" in code
    assert "proxy=proxy)" in code
    namespace: dict[str, object] = {}
    exec(code.split("with FaultProxy")[0], namespace)  # the imports only
    assert eval(repr(s), namespace) == s


def test_a_client_that_raises_in_a_real_kafka_run_stalls_alone(tmp_path: object) -> None:
    """Up to five clients share a real-Kafka run: one that raises is a stall of its own
    (its error in the stall's text), and the runner goes on for the others."""
    from epochguard.testing.chaos.apache import _ApacheRun
    from epochguard.testing.chaos.runner import MemberContext

    class Quiet:
        def poll_once(self) -> None:
            time.sleep(0.01)

        def close(self) -> None:
            pass

    def quiet(_ctx: MemberContext) -> Quiet:
        return Quiet()

    def crashing(_ctx: MemberContext) -> Quiet:
        raise RuntimeError("no broker answered")

    class NoCluster:
        all_bootstrap_servers = "127.0.0.1:1"

    run = _ApacheRun(
        generate_apache(1),
        NoCluster(),  # type: ignore[arg-type]
        {"quiet": quiet, "crashing": crashing},
        str(tmp_path),
        0.0,
        "t",
    )
    run.start_member("quiet")
    run.start_member("crashing")
    (crashed,) = run.members["crashing"]
    crashed.join(5)
    try:
        run.check_members()  # does not raise: the crash is the crashing client's alone
        assert run.members["crashing"] == [] and run.alive("quiet")
        assert "RuntimeError('no broker answered')" in run.crashed["crashing"]
        assert "the client raised RuntimeError" in run.inner_state("crashing", 0)
        assert "raised" not in run.inner_state("quiet", 0)
    finally:
        run.close_members()
