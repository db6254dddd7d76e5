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
* ``access.py``: the brokers' own APIs (share-state RPCs, follower fetches,
  reassignments, SCRAM users) kept for brokers, ``super.users`` or, with an authorizer,
  the principals its ACLs allow.
* ``acls.py`` (pure): ACL bindings and filters, and the authorization decision as Kafka's
  StandardAuthorizer makes it.
* ``authz.py``: the authorizer (``authorizer.class.name``): its ACLs in the data
  directory or etcd, the check every handler calls, and the audit log
  (``shoal.authorizer``).
"""
