"""Request handlers, one module per API family; each registers with ``dispatch.api``."""
