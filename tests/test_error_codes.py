"""epochguard._errors writes Kafka's error codes out: each must be kafka-python's code for
the same error (kafka-python names ``NOT_LEADER_OR_FOLLOWER`` ``NotLeaderForPartitionError``)."""

from __future__ import annotations

import kafka.errors as kerrors
import pytest

from epochguard._errors import ErrorCode

#: The members that kafka-python has a class for, and that class.
KAFKA_PYTHON_CLASS = {
    "NONE": kerrors.NoError,
    "UNKNOWN_SERVER_ERROR": kerrors.UnknownError,
    "OFFSET_OUT_OF_RANGE": kerrors.OffsetOutOfRangeError,
    "CORRUPT_MESSAGE": kerrors.CorruptRecordError,
    "UNKNOWN_TOPIC_OR_PARTITION": kerrors.UnknownTopicOrPartitionError,
    "LEADER_NOT_AVAILABLE": kerrors.LeaderNotAvailableError,
    "NOT_LEADER_OR_FOLLOWER": kerrors.NotLeaderForPartitionError,
    "REQUEST_TIMED_OUT": kerrors.RequestTimedOutError,
    "REPLICA_NOT_AVAILABLE": kerrors.ReplicaNotAvailableError,
    "OFFSET_METADATA_TOO_LARGE": kerrors.OffsetMetadataTooLargeError,
    "NETWORK_EXCEPTION": kerrors.NetworkExceptionError,
    "COORDINATOR_LOAD_IN_PROGRESS": kerrors.CoordinatorLoadInProgressError,
    "COORDINATOR_NOT_AVAILABLE": kerrors.CoordinatorNotAvailableError,
    "NOT_COORDINATOR": kerrors.NotCoordinatorError,
    "NOT_ENOUGH_REPLICAS": kerrors.NotEnoughReplicasError,
    "INVALID_REQUIRED_ACKS": kerrors.InvalidRequiredAcksError,
    "ILLEGAL_GENERATION": kerrors.IllegalGenerationError,
    "INCONSISTENT_GROUP_PROTOCOL": kerrors.InconsistentGroupProtocolError,
    "INVALID_GROUP_ID": kerrors.InvalidGroupIdError,
    "UNKNOWN_MEMBER_ID": kerrors.UnknownMemberIdError,
    "INVALID_SESSION_TIMEOUT": kerrors.InvalidSessionTimeoutError,
    "REBALANCE_IN_PROGRESS": kerrors.RebalanceInProgressError,
    "TOPIC_AUTHORIZATION_FAILED": kerrors.TopicAuthorizationFailedError,
    "GROUP_AUTHORIZATION_FAILED": kerrors.GroupAuthorizationFailedError,
    "CLUSTER_AUTHORIZATION_FAILED": kerrors.ClusterAuthorizationFailedError,
    "UNSUPPORTED_SASL_MECHANISM": kerrors.UnsupportedSaslMechanismError,
    "ILLEGAL_SASL_STATE": kerrors.IllegalSaslStateError,
    "SASL_AUTHENTICATION_FAILED": kerrors.SaslAuthenticationFailedError,
    "UNSUPPORTED_VERSION": kerrors.UnsupportedVersionError,
    "TOPIC_ALREADY_EXISTS": kerrors.TopicAlreadyExistsError,
    "INVALID_PARTITIONS": kerrors.InvalidPartitionsError,
    "INVALID_REPLICATION_FACTOR": kerrors.InvalidReplicationFactorError,
    "INVALID_CONFIG": kerrors.InvalidConfigurationError,
    "NOT_CONTROLLER": kerrors.NotControllerError,
    "INVALID_REQUEST": kerrors.InvalidRequestError,
    "POLICY_VIOLATION": kerrors.PolicyViolationError,
    "KAFKA_STORAGE_ERROR": kerrors.KafkaStorageError,
    "NON_EMPTY_GROUP": kerrors.NonEmptyGroupError,
    "GROUP_ID_NOT_FOUND": kerrors.GroupIdNotFoundError,
    "FENCED_LEADER_EPOCH": kerrors.FencedLeaderEpochError,
    "UNKNOWN_LEADER_EPOCH": kerrors.UnknownLeaderEpochError,
    "OFFSET_NOT_AVAILABLE": kerrors.OffsetNotAvailableError,
    "MEMBER_ID_REQUIRED": kerrors.MemberIdRequiredError,
    "PREFERRED_LEADER_NOT_AVAILABLE": kerrors.PreferredLeaderNotAvailableError,
    "FENCED_INSTANCE_ID": kerrors.FencedInstanceIdError,
    "ELIGIBLE_LEADERS_NOT_AVAILABLE": kerrors.EligibleLeadersNotAvailableError,
    "ELECTION_NOT_NEEDED": kerrors.ElectionNotNeededError,
    "NO_REASSIGNMENT_IN_PROGRESS": kerrors.NoReassignmentInProgressError,
    "GROUP_SUBSCRIBED_TO_TOPIC": kerrors.GroupSubscribedToTopicError,
    "UNSTABLE_OFFSET_COMMIT": kerrors.UnstableOffsetCommitError,
    "UNKNOWN_TOPIC_ID": kerrors.UnknownTopicIdError,
    "INCONSISTENT_TOPIC_ID": kerrors.InconsistentTopicIdError,
    "GROUP_MAX_SIZE_REACHED": kerrors.GroupMaxSizeReachedError,
    "FENCED_MEMBER_EPOCH": kerrors.FencedMemberEpochError,
    "UNRELEASED_INSTANCE_ID": kerrors.UnreleasedInstanceIdError,
    "UNSUPPORTED_ASSIGNOR": kerrors.UnsupportedAssignorError,
    "STALE_MEMBER_EPOCH": kerrors.StaleMemberEpochError,
    "FETCH_SESSION_ID_NOT_FOUND": kerrors.FetchSessionIdNotFoundError,
    "INVALID_FETCH_SESSION_EPOCH": kerrors.InvalidFetchSessionEpochError,
    "FETCH_SESSION_TOPIC_ID_ERROR": kerrors.FetchSessionTopicIdError,
    "OUT_OF_ORDER_SEQUENCE_NUMBER": kerrors.OutOfOrderSequenceNumberError,
    "INVALID_PRODUCER_EPOCH": kerrors.InvalidProducerEpochError,
    "INVALID_TXN_STATE": kerrors.InvalidTxnStateError,
    "INVALID_PRODUCER_ID_MAPPING": kerrors.InvalidProducerIdMappingError,
    "INVALID_TRANSACTION_TIMEOUT": kerrors.InvalidTransactionTimeoutError,
    "CONCURRENT_TRANSACTIONS": kerrors.ConcurrentTransactionsError,
    "TRANSACTION_COORDINATOR_FENCED": kerrors.TransactionCoordinatorFencedError,
    "OPERATION_NOT_ATTEMPTED": kerrors.OperationNotAttemptedError,
    "PRODUCER_FENCED": kerrors.ProducerFencedError,
    "TRANSACTIONAL_ID_NOT_FOUND": kerrors.TransactionalIdNotFoundError,
}


@pytest.mark.parametrize("name", sorted(KAFKA_PYTHON_CLASS))
def test_each_code_is_kafka_pythons(name: str) -> None:
    assert ErrorCode[name] == KAFKA_PYTHON_CLASS[name].errno


def test_every_member_is_checked_or_has_no_kafka_python_class() -> None:
    unchecked = {m.name for m in ErrorCode} - set(KAFKA_PYTHON_CLASS)
    assert unchecked == {"INVALID_REGULAR_EXPRESSION", "REBOOTSTRAP_REQUIRED"}
    for name in unchecked:
        assert not [
            c for c in vars(kerrors).values() if getattr(c, "errno", None) == ErrorCode[name]
        ]
