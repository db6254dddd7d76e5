"""shoal: a Kafka-compatible message broker with share groups (KIP-932)."""

__version__ = "0.1.0"
