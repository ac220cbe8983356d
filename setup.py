"""The two build steps ``pyproject.toml`` cannot declare (all metadata is there).

1. ``nemo_rl_attn_align.pth`` at the top of site-packages, next to the package rather than inside
   it. Regular wheels: ``build_py`` copies it to the root of the build tree. Editable wheels (PEP 660,
   ``pip install -e``): setuptools' ``editable_wheel`` writes no build output into the wheel, so
   ``run()`` adds the file to the finished wheel, as coverage.py's ``setup.py`` does for its
   ``a1_coverage.pth`` (``EditableWheelWithPth``, coverage 7.13.0, coveragepy PR #2100; pytest-cov,
   cited here before, dropped its ``.pth`` in 7.0.0). Here the wheel's ``RECORD`` gets its line too,
   so ``pip uninstall`` removes it. The name sorts after setuptools' ``__editable__*.pth``, so the
   package is importable when ours runs.
2. The example recipes: their one copy is ``examples/configs/`` at the repository root (outside the
   package, where ``package-data`` cannot reach); ``build_py`` copies them into
   ``nemo_rl_attn_align/examples/configs`` of the build tree. An editable install reads them from the
   source tree (``nemo_rl_attn_align/config/example_recipes.py``).

Only public command APIs are used: ``run``, ``get_outputs`` and ``get_output_mapping`` (setuptools'
``SubCommand`` protocol for build steps).
"""

import base64
import hashlib
import zipfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

ROOT = Path(__file__).parent
PTH_FILE = "nemo_rl_attn_align.pth"
EXAMPLES_SOURCE = Path("examples", "configs")
EXAMPLES_TARGET = Path("nemo_rl_attn_align", "examples", "configs")


class BuildPyWithExtras(build_py):
    """``build_py`` that also puts the ``.pth`` at the root of the build tree and the example
    recipes into the package."""

    def _extras(self) -> dict[str, str]:
        """Build-tree path -> source path (relative to the project root) of each extra file."""
        extras = {str(Path(self.build_lib, PTH_FILE)): PTH_FILE}
        for source in sorted((ROOT / EXAMPLES_SOURCE).glob("*.yaml")):
            extras[str(Path(self.build_lib, EXAMPLES_TARGET, source.name))] = str(EXAMPLES_SOURCE / source.name)
        return extras

    def run(self):
        super().run()
        if self.editable_mode:  # the files stay where they are (see nemo_rl_attn_align/config/example_recipes.py)
            return
        for target, source in self._extras().items():
            self.mkpath(str(Path(target).parent))
            self.copy_file(str(ROOT / source), target, preserve_mode=0)

    def get_outputs(self, include_bytecode=True):
        return [*super().get_outputs(include_bytecode), *self._extras()]

    def get_output_mapping(self):
        return {**super().get_output_mapping(), **self._extras()}


def _add_to_wheel(wheel: Path, name: str, data: bytes) -> None:
    """Add ``name`` at the root of ``wheel``, with its line in the wheel's ``RECORD``."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    with zipfile.ZipFile(wheel) as old:
        entries = [(info, old.read(info)) for info in old.infolist()]
    rewritten = wheel.with_name(wheel.name + ".tmp")
    with zipfile.ZipFile(rewritten, "w", zipfile.ZIP_DEFLATED) as new:
        for info, content in entries:
            if info.filename.endswith(".dist-info/RECORD"):
                content = content.rstrip(b"\n") + f"\n{name},sha256={digest},{len(data)}\n".encode()
            new.writestr(info, content)
        new.writestr(name, data)
    rewritten.replace(wheel)


class EditableWheelWithPth(editable_wheel):
    """``editable_wheel`` whose wheel also carries the bootstrap ``.pth`` file."""

    def run(self):
        super().run()
        for wheel in Path(self.dist_dir).glob("*.editable-*.whl"):
            _add_to_wheel(wheel, PTH_FILE, (ROOT / PTH_FILE).read_bytes())


setup(cmdclass={"build_py": BuildPyWithExtras, "editable_wheel": EditableWheelWithPth})
