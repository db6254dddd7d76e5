"""Listeners, TLS and SASL authentication (docs/SECURITY.md).

* ``listeners.py`` (pure): Kafka's ``listeners``, ``advertised.listeners``,
  ``listener.security.protocol.map`` and ``inter.broker.listener.name``, and the
  ``listener.name.<listener>.`` prefixed keys.
* ``tls.py``: the listeners' ``ssl.SSLContext`` from the keystore and truststore settings.
* ``jaas.py`` (pure): Kafka's JAAS lines (``sasl.jaas.config``).
* ``sasl.py``: the server side of PLAIN and SCRAM-SHA-256/512 (SCRAM through ``scramp``).
* ``session.py``: one connection's authentication state and principal; which requests
  it may send before it has authenticated.
* ``credentials.py``: SCRAM credentials, durable in the data directory (one broker) or in
  etcd (a cluster).
* ``client.py``: the client side, for connections from one broker to another on
  ``inter.broker.listener.name``.
"""
