"""The runtime: the engine every facade and the harness drive (`engine`, its
operations in `engine_ops`, its serving reads in `serving`, restore on open in
`restore`, calls in `call`, each caller's writes in `callers`), the
operation table (`operations`, rendered by `gen_operations`), signal intake
(`intake`), the `Host` protocol (`host`) and the choice of host (`hosts`), the pykka
host with its bounded mailboxes and supervision (`pykka_host`, `mailbox`,
`supervision`), and the Ray host (`ray_host`, with `ray_actor`, `ray_links`,
`ray_replies`, `ray_stores`; imported only when ``Config.host`` is ``"ray"``).
"""
