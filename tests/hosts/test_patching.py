"""``vocab.patching``: wrappers known by identity, unwrapping back to exactly what was there.

Third parties stack their own wrappers on the functions the plugin wraps (``functools.wraps`` is
how opentelemetry's and most decorators do it): their layer must survive our ``unwrap``, and
nothing of ours may be copied onto it. Inherited methods are wrapped on the subclass and must come
back as inherited, with no attribute left on the subclass.
"""

from __future__ import annotations

import functools
import gc
import types

from nemo_rl_attn_align.hosts import hooks
from nemo_rl_attn_align.vocab import patching as _patching


def recording(calls: list, label: str):
    """``make_wrapper`` for ``wrap``: logs ``label`` and calls the original."""

    def make(original):
        def wrapper(*args, **kwargs):
            calls.append(label)
            return original(*args, **kwargs)

        return wrapper

    return make


def third_party(calls: list, func):
    """Someone else's decorator stacked on ``func``, the usual way (``functools.wraps``)."""

    @functools.wraps(func)
    def theirs(*args, **kwargs):
        calls.append("theirs")
        return func(*args, **kwargs)

    return theirs


def module_with(func) -> types.ModuleType:
    module = types.ModuleType("host_module")
    module.f = func
    return module


def test_wrap_unwrap_module_function_restores_the_same_object():
    def f(x):
        return x + 1

    module, calls = module_with(f), []
    assert _patching.wrap(module, "f", recording(calls, "ours"))
    assert module.f is not f and module.f.__name__ == "f" and module.f.__wrapped__ is f
    assert not _patching.wrap(module, "f", recording(calls, "again"))  # idempotent: one layer
    assert module.f(1) == 2 and calls == ["ours"]
    assert _patching.is_wrapped(module.f) and not _patching.is_wrapped(f)
    assert _patching.unwrap(module, "f") and module.f is f
    assert not _patching.unwrap(module, "f")  # nothing of ours left


def test_a_third_party_wrapper_stacked_on_ours_survives_unwrap():
    def f(x):
        return x * 2

    module, calls = module_with(f), []
    _patching.wrap(module, "f", recording(calls, "ours"))
    ours = module.f
    module.f = theirs = third_party(calls, ours)
    # functools.wraps copied nothing of ours that could pass their wrapper off as ours
    assert set(vars(theirs)) == {"__wrapped__"} and _patching._layer_of(theirs) is None
    assert _patching.is_wrapped(theirs)  # ours is under it
    assert not _patching.wrap(module, "f", recording(calls, "twice"))  # found under their layer
    assert module.f(3) == 6 and calls == ["theirs", "ours"]

    calls.clear()
    assert _patching.unwrap(module, "f")
    assert module.f is theirs  # their layer stays
    assert module.f(3) == 6 and calls == ["theirs"]  # ours passes straight through
    assert not _patching.is_wrapped(theirs)

    calls.clear()
    assert _patching.wrap(module, "f", recording(calls, "ours"))  # ours switched back on, not stacked again
    assert module.f is theirs and module.f(3) == 6 and calls == ["theirs", "ours"]
    assert _patching.unwrap(module, "f") and module.f is theirs


def test_a_third_party_wrapper_without_wrapped_is_left_in_place_too():
    def f():
        return "f"

    module, calls = module_with(f), []
    _patching.wrap(module, "f", recording(calls, "ours"))
    ours = module.f
    module.f = theirs = lambda: ("theirs", ours())  # no __wrapped__: ours is invisible inside it
    assert _patching.unwrap(module, "f")
    assert module.f is theirs and module.f() == ("theirs", "f") and calls == []


def test_unwrapping_an_inherited_method_leaves_no_attribute_on_the_subclass():
    class Base:
        def m(self):
            return "base"

    class Sub(Base):
        pass

    calls = []
    assert _patching.wrap(Sub, "m", recording(calls, "ours"))
    assert "m" in vars(Sub) and Sub().m() == "base" and Base().m() == "base" and calls == ["ours"]
    assert _patching.unwrap(Sub, "m")
    assert "m" not in vars(Sub) and Sub.m is Base.m  # inherited again, not shadowed
    Base.m = lambda self: "base, redefined"  # a later change to the base reaches the subclass
    assert Sub().m() == "base, redefined"


def test_unwrapping_restores_the_owners_own_entry_as_it_was():
    class Host:
        def m(self):
            return "own"

    own = vars(Host)["m"]
    _patching.wrap(Host, "m", recording([], "ours"))
    _patching.unwrap(Host, "m")
    assert vars(Host)["m"] is own


def test_a_replaced_function_is_wrapped_afresh_and_dead_wrappers_are_forgotten():
    """``importlib.reload`` (or a monkeypatch) puts a new function where our wrapper was."""

    def f():
        return 1

    def g():
        return 2

    module, calls = module_with(f), []
    _patching.wrap(module, "f", recording(calls, "ours"))
    stale = len(_patching._layers)
    module.f = g
    gc.collect()
    assert len(_patching._layers) == stale - 1  # the wrapper is gone, and so is its entry
    assert _patching.wrap(module, "f", recording(calls, "ours")) and module.f() == 2 and calls == ["ours"]
    assert _patching.unwrap(module, "f") and module.f is g


def test_a_name_imported_from_a_wrapped_module_is_not_wrapped_twice():
    def f():
        return 1

    source, calls = module_with(f), []
    _patching.wrap(source, "f", recording(calls, "ours"))
    importer = module_with(source.f)  # `from source import f` after the patch
    assert not _patching.wrap(importer, "f", recording(calls, "again"))
    assert importer.f() == 1 and calls == ["ours"]
    _patching.unwrap(source, "f")


def test_seams_detach_puts_back_inherited_and_stacked_sites():
    class Base:
        def m(self):
            return "base"

    class Sub(Base):
        pass

    def f():
        return "f"

    module, calls = module_with(f), []
    seams = hooks.Hook("te_readback")
    seams.wrap(Sub, "m", recording(calls, "ours"))
    seams.wrap(module, "f", recording(calls, "ours"))
    module.f = theirs = third_party(calls, module.f)
    seams.detach()
    assert "m" not in vars(Sub) and module.f is theirs and module.f() == "f" and calls == ["theirs"]


def test_original_of_names_the_host_function_under_our_layer_and_a_foreign_one():
    import functools
    import types

    from nemo_rl_attn_align.vocab import patching as _patching

    def host():
        return "host"

    owner = types.SimpleNamespace(f=host)
    assert _patching.original_of(owner.f) is host  # nothing of ours: the function itself
    _patching.wrap(owner, "f", lambda original: lambda: "ours")
    ours = owner.f
    foreign = functools.wraps(ours)(lambda: ours())
    assert _patching.original_of(ours) is host and _patching.original_of(foreign) is host
    _patching.unwrap(owner, "f")


def test_a_classmethod_is_wrapped_as_a_classmethod_and_binds_the_class_it_is_called_on():
    """``getattr`` would hand over the method bound to ``Base`` and install a plain function: an
    instance call would then pass ``self`` on top, and a subclass would get ``Base`` as ``cls``."""

    class Base:
        @classmethod
        def make(cls, x):
            return cls, x

    class Sub(Base):
        pass

    own, seen = vars(Base)["make"], []

    def make_wrapper(original):
        def hooked(cls, x):
            seen.append(cls)
            return original(cls, x)

        return hooked

    assert _patching.wrap(Base, "make", make_wrapper)
    assert isinstance(vars(Base)["make"], classmethod)
    assert Base.make(1) == (Base, 1) and Sub.make(2) == (Sub, 2) and Sub().make(3) == (Sub, 3)
    assert seen == [Base, Sub, Sub] and _patching.is_wrapped(vars(Base)["make"].__func__)
    assert not _patching.wrap(Base, "make", make_wrapper)  # one layer
    assert _patching.unwrap(Base, "make") and vars(Base)["make"] is own


def test_an_inherited_classmethod_wrapped_on_the_subclass_comes_back_inherited():
    class Base:
        @classmethod
        def name(cls):
            return cls.__name__

    class Sub(Base):
        pass

    class Leaf(Sub):
        pass

    calls = []
    assert _patching.wrap(Sub, "name", recording(calls, "ours"))
    assert Sub().name() == "Sub" and Leaf.name() == "Leaf" and Base.name() == "Base" and calls == ["ours", "ours"]
    assert _patching.unwrap(Sub, "name") and "name" not in vars(Sub) and Sub.name() == "Sub"


def test_a_staticmethod_is_wrapped_as_a_staticmethod_and_restored_exactly():
    """``getattr`` strips the staticmethod: a plain function on the class would take ``self``."""

    class Host:
        @staticmethod
        def add(a, b):
            return a + b

    own, calls = vars(Host)["add"], []
    assert _patching.wrap(Host, "add", recording(calls, "ours"))
    assert isinstance(vars(Host)["add"], staticmethod)
    assert Host.add(1, 2) == 3 and Host().add(3, 4) == 7 and calls == ["ours", "ours"]
    assert _patching.unwrap(Host, "add") and vars(Host)["add"] is own and Host().add(1, 1) == 2
