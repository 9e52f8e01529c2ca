"""Schedules are data: seeded, validated, printable as code that replays them, shrinkable."""

from __future__ import annotations

import pytest

from epochguard.testing.chaos import schedule as sch
from epochguard.testing.chaos.schedule import (
    Elect,
    FetchFault,
    Join,
    Leave,
    Produce,
    Schedule,
    ScheduleError,
    generate,
)
from epochguard.testing.chaos.shrink import shrink


def test_the_same_seed_gives_the_same_schedule_and_others_differ() -> None:
    assert generate(42) == generate(42)
    assert len({generate(s) for s in range(20)}) == 20


def test_the_generator_covers_every_kind_of_step() -> None:
    txn = {sch.TxnProduce, sch.TxnEnd}
    kinds = {type(step) for s in range(300) for step in generate(s).steps}
    assert kinds == set(sch._STEP_TYPES) - {sch.NetFault, *txn}
    with_network = {type(step) for s in range(300) for step in generate(s, network=True).steps}
    assert with_network == set(sch._STEP_TYPES) - txn
    net_kinds = {
        step.kind
        for s in range(300)
        for step in generate(s, network=True).steps
        if isinstance(step, sch.NetFault)
    }
    assert net_kinds == set(sch.NET_FAULT_KINDS)
    shapes = {(s.partitions, s.members, s.policy, s.offsets) for s in map(generate, range(300))}
    assert {p for p, *_ in shapes} == {1, 2, 3, 4}
    assert {m for _, m, *_ in shapes} == {1, 2, 3}
    assert {(pol, off) for *_, pol, off in shapes} >= {
        ("rewind", "group"),
        ("raise", "group"),
        ("rewind", "store"),
        ("raise", "store"),
    }


def test_without_unclean_and_on_real_kafka_the_generator_keeps_to_what_is_allowed() -> None:
    for seed in range(100):
        assert not generate(seed, unclean=False).unclean
        for step in generate(seed, real_kafka=True).steps:
            assert isinstance(step, sch.REAL_KAFKA_STEPS), step


def test_transactional_schedules_mix_transactions_into_the_faults() -> None:
    schedules = [generate(seed, transactions=True) for seed in range(300)]
    kinds = {type(step) for s in schedules for step in s.steps}
    # Every fault but topic re-creation (and network faults, a flag of their own).
    assert kinds == set(sch._STEP_TYPES) - {sch.NetFault, sch.RecreateTopic}
    assert {s.transactions for s in schedules} == {1, 2}
    assert all(s.read_committed for s in schedules)
    ends = [step for s in schedules for step in s.steps if isinstance(step, sch.TxnEnd)]
    assert {e.commit for e in ends} == {True, False}
    for s in schedules:
        for step in s.steps:
            if isinstance(step, sch.TxnProduce | sch.TxnEnd):
                assert step.producer < s.transactions
    # Other seeds keep their schedules; no plain schedule has a transaction.
    for seed in range(200):
        plain = generate(seed)
        assert plain.transactions == 0 and not plain.read_committed
        assert generate(seed, transactions=False) == plain
    s = schedules[0]
    assert eval(repr(s), vars(sch)) == s
    assert f"transactions={s.transactions}," in s.to_code()
    assert "transactions=" not in generate(0).to_code()


def test_network_faults_leave_the_other_seeds_alone() -> None:
    # Seeds name schedules (the CI set, the regressions): network=False draws what it did.
    for seed in range(200):
        plain = generate(seed)
        assert not plain.network and plain.injected_delay_s == 0
        assert generate(seed, network=False) == plain
    assert sum(generate(seed, network=True).network for seed in range(50)) >= 45


def test_consumers_start_and_join_after_a_blackhole() -> None:
    # A consumer created while a bootstrap address is half-open must try the others
    # (EpochConsumer gives a set-up up after its timeout): the schedules test it.
    after = {sch.Join: 0, sch.RestartConsumer: 0}
    for seed in range(300):
        seen = False
        for step in generate(seed, network=True).steps:
            if isinstance(step, sch.NetFault) and step.kind == "blackhole":
                seen = True
            elif seen and type(step) in after:
                after[type(step)] += 1
    assert min(after.values()) >= 10, after


def test_metadata_delays_meet_re_creation_with_group_commits_too() -> None:
    # Group commits go by topic id, so a coordinator whose metadata lags a re-creation
    # keeps them (docs/reliability.md): schedules that commit to the group get metadata
    # delays across re-creations, as those that store positions in an offset store do.
    both = {"group": 0, "store": 0}
    for seed in range(600):
        s = generate(seed, group_recreate=True)
        steps = s.steps
        if any(isinstance(x, sch.RecreateTopic) for x in steps) and any(
            isinstance(x, sch.MetadataDelay) for x in steps
        ):
            both[s.offsets] += 1
    assert both["group"] >= 5 and both["store"] >= 5, both


def test_repr_is_code_that_replays_the_schedule() -> None:
    s = generate(7)
    assert eval(repr(s), vars(sch)) == s
    net = generate(7, network=True)
    assert net.network and eval(repr(net), vars(sch)) == net
    code = s.to_code()
    assert code.startswith("from epochguard.testing.chaos import run_schedule")
    assert repr(s.steps[0]) in code


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Produce(0, 0), "count must be an int >= 1, got 0"),
        (lambda: Produce(-1, 1), "partition must be an int >= 0, got -1"),
        (lambda: Elect(True, pick=0), "partition must be an int >= 0, got True"),
        (lambda: FetchFault(99, "drop"), "api must be one of"),
        (lambda: FetchFault(1, "explode"), "kind must be delay, drop or disconnect"),
        (lambda: sch.Idle(-1), "seconds must be seconds in [0, 30], got -1"),
        (lambda: sch.DeleteRecords(0, 0), "fraction must be in (0, 1]"),
        (lambda: sch.NetFault("flood"), "kind must be one of"),
        (lambda: sch.NetFault("bandwidth", seconds=1.0), "needs bytes_per_s >= 1"),
        (lambda: sch.NetFault("cut", at_byte=-1), "at_byte must be an int >= 0"),
        (lambda: sch.NetFault("cut", api=99), "api must be None or one of"),
        (lambda: sch.NetFault("partition", seconds=60), "seconds must be seconds in [0, 30]"),
        (lambda: Schedule(1, (Produce(2, 1),), partitions=2), "names partition 2 of 2"),
        (lambda: Schedule(1, (), policy="ignore"), "policy must be rewind or raise"),
        (lambda: Schedule(1, (), members=2, offsets="store"), "commits to its group"),
        (lambda: Schedule(1, ("produce",)), "not a chaos step: 'produce'"),
        (lambda: sch.TxnProduce(0, 0), "count must be an int >= 1, got 0"),
        (
            lambda: Schedule(1, (sch.TxnEnd(1),), transactions=1),
            "names transactional producer 1 of 1",
        ),
        (lambda: Schedule(1, (sch.TxnProduce(0, 1),)), "names transactional producer 0 of 0"),
    ],
)
def test_bad_schedules_are_refused_by_name(make: object, message: str) -> None:
    with pytest.raises(ScheduleError, match=None) as info:
        make()  # type: ignore[operator]
    assert message in str(info.value)


def test_shrink_drops_partitions_members_and_steps_while_it_still_fails() -> None:
    noise = generate(7, partitions=2, members=1).steps
    s = Schedule(7, (*noise, Produce(1, 3, 1), *noise, Elect(1, True, 2), *noise), partitions=2)

    def fails(c: Schedule) -> bool:  # a stand-in for a run: needs both steps on partition 1
        return Produce(1, 3, 1) in c.steps and Elect(1, True, 2) in c.steps

    small, runs = shrink(s, fails)
    assert small.steps == (Produce(1, 3, 1), Elect(1, True, 2))
    assert small.partitions == 2  # partition 1 is needed
    assert 0 < runs <= 80
    assert Produce(1, 3, 1) not in noise and Elect(1, True, 2) not in noise
    group = Schedule(3, (Join(), Produce(0, 1), Leave(0)), partitions=1, members=3)
    smaller, _ = shrink(group, lambda c: any(isinstance(x, Produce) for x in c.steps))
    assert smaller == Schedule(3, (Produce(0, 1),), partitions=1, members=1)


def test_the_example_in_docs_testing_runs(capsys: pytest.CaptureFixture[str]) -> None:
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "testing.md").read_text()
    (block,) = [
        b for b in re.findall(r"```python\n(.*?)```", doc, flags=re.S) if "run_schedule(" in b
    ]
    exec(compile(block, "docs/guides/testing.md:chaos", "exec"), {})
    out = capsys.readouterr().out
    assert "silent losses 0, silent re-reads 0" in out
    assert "Schedule(" in out and "seed=42" in out
