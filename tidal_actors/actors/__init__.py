"""The actors: one behaviour per actor kind (membership shard, ledger shard, purge
coordinator with its re-materializer, persistence), the messages they exchange, the
one-shot reply slot, and the exchange that restarts a shard from the store. A
behaviour handles one message at a time through the context its host gives it and
never knows the host (`runtime.pykka_host` in production, `testing.sim_host` in tests).
"""
