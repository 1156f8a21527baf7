"""What a client of the key-release protocol can learn from the broker: a refusal (always opaque;
the broker's audit log has the reason) or a rate limit. The broker's own error tree, with reasons,
is `key_broker.errors`."""


class BrokerClientError(Exception):
    """Base of every failure a broker client reports."""


class BrokerRefused(BrokerClientError):
    """The broker answered 403: a challenge, attestation or key request was refused."""


class BrokerRateLimited(BrokerClientError):
    """The broker answered 429: retry later."""


class BrokerNotAuthenticated(BrokerClientError):
    """The key broker could not be authenticated: its evidence, identity, token or receipt does not
    verify against what the worker pins. Nothing it answered is used."""
