"""The one check that an installed host fits a declared seam (``hooks.fits``)."""

from __future__ import annotations

import types

from nemo_rl_attn_align.hosts import hooks
from nemo_rl_attn_align.hosts.seams import Seam


def test_a_seam_fits_by_its_leading_parameters_and_a_broken_path_never_fits():
    class Owner:
        def method(self, a, b, c=None):
            return a

    module = types.ModuleType("host")
    module.Owner, module.len = Owner, len
    assert hooks.fits(Seam("host", "Owner.method", ("self", "a"), "_wrap"), module)
    assert not hooks.fits(Seam("host", "Owner.method", ("self", "b"), "_wrap"), module)
    assert not hooks.fits(Seam("host", "Missing.__init__", (), "_wrap"), module)  # None.__init__ is no seam
    assert hooks.fits(Seam("host", "Owner.__init__", (), "_wrap"), module)  # no parameters needed: any callable
    assert not hooks.fits(Seam("host", "len", ("obj", "extra"), "_wrap"), module)
