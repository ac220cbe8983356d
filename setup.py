"""Ship ``nemo_rl_attn_align.pth`` at the top of site-packages (all metadata is in pyproject.toml).

setuptools has no declarative way to put a file next to the packages rather than inside one:
``build_py`` copies it into the build tree for wheels and regular installs (the technique of
pytest-cov and pytest-socket), and ``editable_wheel`` (PEP 660, ``pip install -e``) writes it
into the editable wheel beside setuptools' own ``__editable__`` finder, whose ``.pth`` sorts first.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH_FILE = "nemo_rl_attn_align.pth"
PTH_SOURCE = Path(__file__).parent / PTH_FILE


class BuildPyWithPth(build_py):
    """``build_py`` that also places the bootstrap ``.pth`` file at the root of the build tree."""

    def run(self):
        super().run()
        self.copy_file(str(PTH_SOURCE), str(Path(self.build_lib) / PTH_FILE), preserve_mode=0)

    def get_outputs(self, include_bytecode=True):
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib) / PTH_FILE)]


class _StrategyWithPth:
    """Wraps setuptools' editable strategy (its ``EditableStrategy`` protocol) to add the ``.pth``."""

    def __init__(self, strategy):
        self.strategy = strategy

    def __enter__(self):
        self.strategy.__enter__()
        return self

    def __exit__(self, *exc_info):
        return self.strategy.__exit__(*exc_info)

    def __call__(self, wheel, files, mapping):
        self.strategy(wheel, files, mapping)
        wheel.writestr(PTH_FILE, PTH_SOURCE.read_bytes())


class EditableWheelWithPth(editable_wheel):
    """``editable_wheel`` whose wheel also carries the bootstrap ``.pth`` file."""

    def _select_strategy(self, *args, **kwargs):
        return _StrategyWithPth(super()._select_strategy(*args, **kwargs))


setup(cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth})
