"""The scoreboard's adapters work: each reference client consumes a schedule with a known
truncation, and what it does (report, silent re-read or loss) reaches the oracle. What each
client does across many schedules is measured, not asserted: ``python -m benchmarks
chaos_scoreboard`` (docs/reliability.md)."""

from __future__ import annotations

import pytest

from epochguard.testing.chaos import generate, run_schedule
from epochguard.testing.chaos.clients import CLIENTS

from .test_chaos_ci import KNOWN

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.mark.parametrize("client", ["kafka-python", "confluent-kafka", "aiokafka"])
def test_a_reference_client_runs_a_known_truncation_and_the_oracle_sees_its_answer(
    client: str,
) -> None:
    result = run_schedule(KNOWN, {client: CLIENTS[client]})
    v = result.verdict
    assert result.client == client
    assert v.delivered >= 10, result.describe()  # 8 before the election, 2 after, the marker
    # The 3 records only the old leader had were read: the client either said so or the
    # oracle caught the silence.
    assert v.reports + v.silent_rereads + v.silent_losses >= 1, result.describe()


@pytest.mark.parametrize("client", ["kafka-python", "confluent-kafka", "aiokafka"])
def test_a_reference_client_in_a_group_with_rebalances_consumes_to_the_end(client: str) -> None:
    schedule = generate(7, unclean=False, members=2, partitions=2)
    result = run_schedule(schedule, {client: CLIENTS[client]})
    assert result.verdict.delivered > 0, result.describe()
    assert result.verdict.stalls == 0, result.describe()
