"""The loop as a ``gymnasium`` environment (``terra/Drive-v0``)."""
