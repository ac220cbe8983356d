"""Host adapters: one thin module per process kind the plugin runs in.

The functions each host module wraps are declared once in ``seams.HOOKS``; ``hooks.Hook`` checks the
host versions against ``vocab.host_versions.SUPPORTED`` once per process when it first patches, wraps each seam
the installed host fits and gives each host module idempotent ``attach()`` / ``detach()``.
``bootstrap`` is the stdlib-only machinery that runs at interpreter start and attaches a host only
when one of its seams' modules is imported. ``driver_report`` patches nothing: it keeps the driver's
one run report, fed by the ``nemo_rl_driver`` hooks.
"""
