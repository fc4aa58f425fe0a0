"""The runtime: the engine every facade and the harness drive (`engine`, its
operations in `engine_ops`, restore on open in `restore`, calls in `call`), the
operation table (`operations`, rendered by `gen_operations`), signal intake
(`intake`), the `Host` protocol (`host`), and the pykka host with its bounded mailboxes
and supervision (`pykka_host`, `mailbox`, `supervision`).
"""
