"""A shoal cluster: metadata and leadership in etcd, partitions replicated between brokers.

Pure modules (no I/O, no clocks; time comes in as ``now_ms``):

* ``partition_state.py``: a partition's leader, leader epoch, partition epoch, replicas and
  ISR, and every transition the controller or a leader may make (each bumps the
  partition epoch; a leader change also bumps the leader epoch);
* ``replication.py``: the leader's rules: high watermark, caught-up and lagging followers;
* ``placement.py``: replica assignment for new topics and partitions (rack-aware);
* ``leader_epochs.py``: a log's leader-epoch cache (the ``leader-epoch-checkpoint`` file's
  content) and the end-offset rule of OffsetsForLeaderEpoch;
* ``metadata.py``: the metadata interface the handlers use, and the local store (one
  broker, today's files), which is the default.

The asyncio shell of cluster mode:

* ``etcd_store.py``: the etcd store: cluster id, broker registrations under leases,
  topics, partition states (compare-and-swap on each key's mod revision), the controller
  election, and one watch that keeps a local copy current;
* ``controller.py``: the elected controller's loop over that copy;
* ``replica_manager.py``: this broker's side: leader or follower of each partition, high
  watermarks, ISR changes, acks=all waits, and the follower fetchers (``fetcher.py``).
"""
