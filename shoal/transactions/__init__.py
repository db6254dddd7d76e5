"""Transactions: the transaction coordinator's pure state machine (``coordinator``)."""
