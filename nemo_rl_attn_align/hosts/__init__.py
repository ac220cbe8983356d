"""Host adapters: one thin module per process kind the plugin runs in.

Each host module names the modules it patches (``TARGETS``), checks the host versions against
``versions.SUPPORTED`` once per process when it first patches, and exposes idempotent ``attach()`` /
``detach()`` (``_patching.Seams``).
``bootstrap`` is the stdlib-only machinery that runs at interpreter start and attaches a host only
when its target module is imported. ``driver_report`` patches nothing: it keeps the driver's one
run report, fed by the ``nemo_rl_driver`` hooks.
"""
