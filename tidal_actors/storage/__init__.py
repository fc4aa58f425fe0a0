"""Storage: every byte on disk (`format`), the `Store` protocols (`protocol`), restore
(`restore`), the durable history read back (`history`, `rematerialize`) and rewritten
in blocks by `compact()` (`history_compact`), the LMDB
environment, its lock, compaction and read-only reader (`lmdb_*`), the stores without
LMDB (`stores`), and the settings recorded in a store (`settings`).
"""
