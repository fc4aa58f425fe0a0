"""The facades applications call: `TidalDb` (blocking, thread-safe; `blocking`), its
read-only view (`readonly`), and `AsyncTidalDb` / `open_tidal` under trio and asyncio
(`aio`). Their operations are generated from `runtime.operations` into the
``_generated_*`` modules.
"""
