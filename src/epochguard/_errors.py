"""Kafka error codes by name, for the consumer, the core and the test brokers.

The codes themselves come from ``kafka.errors`` (one source); this enum only gives the ones
epochguard branches on or answers with readable names and an ``int`` type. Names follow
Kafka's protocol (``NOT_LEADER_OR_FOLLOWER``, code 6, is kafka-python's
``NotLeaderForPartitionError``). To turn a code from the wire into an exception class use
``epochguard.consumer.wire.error_from_wire``.
"""

from __future__ import annotations

import enum

import kafka.errors as kerrors

__all__ = ["ErrorCode", "error_name"]


class ErrorCode(enum.IntEnum):
    NONE = kerrors.NoError.errno
    UNKNOWN_SERVER_ERROR = kerrors.UnknownError.errno
    OFFSET_OUT_OF_RANGE = kerrors.OffsetOutOfRangeError.errno
    CORRUPT_MESSAGE = kerrors.CorruptRecordError.errno
    UNKNOWN_TOPIC_OR_PARTITION = kerrors.UnknownTopicOrPartitionError.errno
    LEADER_NOT_AVAILABLE = kerrors.LeaderNotAvailableError.errno
    NOT_LEADER_OR_FOLLOWER = kerrors.NotLeaderForPartitionError.errno
    REQUEST_TIMED_OUT = kerrors.RequestTimedOutError.errno
    REPLICA_NOT_AVAILABLE = kerrors.ReplicaNotAvailableError.errno
    OFFSET_METADATA_TOO_LARGE = kerrors.OffsetMetadataTooLargeError.errno
    NETWORK_EXCEPTION = kerrors.NetworkExceptionError.errno
    COORDINATOR_LOAD_IN_PROGRESS = kerrors.CoordinatorLoadInProgressError.errno
    COORDINATOR_NOT_AVAILABLE = kerrors.CoordinatorNotAvailableError.errno
    NOT_COORDINATOR = kerrors.NotCoordinatorError.errno
    NOT_ENOUGH_REPLICAS = kerrors.NotEnoughReplicasError.errno
    INVALID_REQUIRED_ACKS = kerrors.InvalidRequiredAcksError.errno
    ILLEGAL_GENERATION = kerrors.IllegalGenerationError.errno
    INCONSISTENT_GROUP_PROTOCOL = kerrors.InconsistentGroupProtocolError.errno
    INVALID_GROUP_ID = kerrors.InvalidGroupIdError.errno
    UNKNOWN_MEMBER_ID = kerrors.UnknownMemberIdError.errno
    INVALID_SESSION_TIMEOUT = kerrors.InvalidSessionTimeoutError.errno
    REBALANCE_IN_PROGRESS = kerrors.RebalanceInProgressError.errno
    TOPIC_AUTHORIZATION_FAILED = kerrors.TopicAuthorizationFailedError.errno
    GROUP_AUTHORIZATION_FAILED = kerrors.GroupAuthorizationFailedError.errno
    CLUSTER_AUTHORIZATION_FAILED = kerrors.ClusterAuthorizationFailedError.errno
    UNSUPPORTED_SASL_MECHANISM = kerrors.UnsupportedSaslMechanismError.errno
    ILLEGAL_SASL_STATE = kerrors.IllegalSaslStateError.errno
    SASL_AUTHENTICATION_FAILED = kerrors.SaslAuthenticationFailedError.errno
    UNSUPPORTED_VERSION = kerrors.UnsupportedVersionError.errno
    TOPIC_ALREADY_EXISTS = kerrors.TopicAlreadyExistsError.errno
    INVALID_PARTITIONS = kerrors.InvalidPartitionsError.errno
    INVALID_REPLICATION_FACTOR = kerrors.InvalidReplicationFactorError.errno
    INVALID_CONFIG = kerrors.InvalidConfigurationError.errno
    NOT_CONTROLLER = kerrors.NotControllerError.errno
    INVALID_REQUEST = kerrors.InvalidRequestError.errno
    POLICY_VIOLATION = kerrors.PolicyViolationError.errno
    KAFKA_STORAGE_ERROR = kerrors.KafkaStorageError.errno
    NON_EMPTY_GROUP = kerrors.NonEmptyGroupError.errno
    GROUP_ID_NOT_FOUND = kerrors.GroupIdNotFoundError.errno
    FENCED_LEADER_EPOCH = kerrors.FencedLeaderEpochError.errno
    UNKNOWN_LEADER_EPOCH = kerrors.UnknownLeaderEpochError.errno
    OFFSET_NOT_AVAILABLE = kerrors.OffsetNotAvailableError.errno
    MEMBER_ID_REQUIRED = kerrors.MemberIdRequiredError.errno
    PREFERRED_LEADER_NOT_AVAILABLE = kerrors.PreferredLeaderNotAvailableError.errno
    FENCED_INSTANCE_ID = kerrors.FencedInstanceIdError.errno
    ELIGIBLE_LEADERS_NOT_AVAILABLE = kerrors.EligibleLeadersNotAvailableError.errno
    ELECTION_NOT_NEEDED = kerrors.ElectionNotNeededError.errno
    NO_REASSIGNMENT_IN_PROGRESS = kerrors.NoReassignmentInProgressError.errno
    GROUP_SUBSCRIBED_TO_TOPIC = kerrors.GroupSubscribedToTopicError.errno
    UNSTABLE_OFFSET_COMMIT = kerrors.UnstableOffsetCommitError.errno
    UNKNOWN_TOPIC_ID = kerrors.UnknownTopicIdError.errno
    INCONSISTENT_TOPIC_ID = kerrors.InconsistentTopicIdError.errno
    # KIP-848 consumer groups.
    GROUP_MAX_SIZE_REACHED = kerrors.GroupMaxSizeReachedError.errno
    FENCED_MEMBER_EPOCH = kerrors.FencedMemberEpochError.errno
    UNRELEASED_INSTANCE_ID = kerrors.UnreleasedInstanceIdError.errno
    UNSUPPORTED_ASSIGNOR = kerrors.UnsupportedAssignorError.errno
    STALE_MEMBER_EPOCH = kerrors.StaleMemberEpochError.errno
    # kafka-python 3.0 has no class for it (Kafka 4's Errors.INVALID_REGULAR_EXPRESSION).
    INVALID_REGULAR_EXPRESSION = 128
    # KIP-1102 (Metadata v13's top-level error); kafka-python 3.0 has no class for it either.
    REBOOTSTRAP_REQUIRED = 129
    FETCH_SESSION_ID_NOT_FOUND = kerrors.FetchSessionIdNotFoundError.errno
    INVALID_FETCH_SESSION_EPOCH = kerrors.InvalidFetchSessionEpochError.errno
    FETCH_SESSION_TOPIC_ID_ERROR = kerrors.FetchSessionTopicIdError.errno
    # Idempotent and transactional producers.
    OUT_OF_ORDER_SEQUENCE_NUMBER = kerrors.OutOfOrderSequenceNumberError.errno
    INVALID_PRODUCER_EPOCH = kerrors.InvalidProducerEpochError.errno
    INVALID_TXN_STATE = kerrors.InvalidTxnStateError.errno
    INVALID_PRODUCER_ID_MAPPING = kerrors.InvalidProducerIdMappingError.errno
    INVALID_TRANSACTION_TIMEOUT = kerrors.InvalidTransactionTimeoutError.errno
    CONCURRENT_TRANSACTIONS = kerrors.ConcurrentTransactionsError.errno
    TRANSACTION_COORDINATOR_FENCED = kerrors.TransactionCoordinatorFencedError.errno
    OPERATION_NOT_ATTEMPTED = kerrors.OperationNotAttemptedError.errno
    PRODUCER_FENCED = kerrors.ProducerFencedError.errno
    TRANSACTIONAL_ID_NOT_FOUND = kerrors.TransactionalIdNotFoundError.errno


def error_name(code: int) -> str:
    """``fenced_leader_epoch`` for 74; ``error_<code>`` for a code not listed here."""
    try:
        return ErrorCode(code).name.lower()
    except ValueError:
        return f"error_{code}"
