"""common.clients.kafka_error: the Kafka error a failed call carries, also when confluent-kafka
raises it as a SystemError from inside a callback (tests/integration/test_kafka_acl.py meets that
on a real broker)."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from common.clients import is_authorization, kafka_error


def _raised_from_a_callback(inner: BaseException) -> SystemError:
    """A SystemError chained to `inner`, as raising one while handling it makes it."""
    outer = SystemError("<method 'append' of 'list' objects> returned a result with an exception set")
    outer.__cause__ = inner
    return outer


def test_the_error_of_a_kafka_exception_and_of_a_system_error_wrapping_one():
    refused = KafkaError(KafkaError.CLUSTER_AUTHORIZATION_FAILED, "no producer id", fatal=True)
    assert kafka_error(KafkaException(refused)) is refused
    assert kafka_error(_raised_from_a_callback(KafkaException(refused))) is refused
    assert is_authorization(refused)


def test_no_error_where_kafka_gave_none():
    assert kafka_error(SystemError("something else")) is None
    assert kafka_error(_raised_from_a_callback(ValueError("x"))) is None
    assert kafka_error(KafkaException("a bare message")) is None
    assert not is_authorization(KafkaError(KafkaError._TIMED_OUT))
