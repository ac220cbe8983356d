"""The driver hook on NeMo-RL's single-controller setup (``setup_single_controller``, 7ea279a), with a
stand-in package of its layout: ``single_controller_utils/setup.py`` defines it and the package's
``__init__`` re-exports it, which ``examples/run_grpo_single_controller.py`` imports. The real module:
``tests/real_nemo_rl/test_single_controller_hook.py``."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from nemo_rl_attn_align.hosts import driver_report, handoff, nemo_rl_driver
from nemo_rl_attn_align.vocab import patching as _patching
from nemo_rl_attn_align.vocab.errors import RuleViolation
from tests.hosts.conftest import standin
from tests.hosts.test_driver_and_launcher import master_config

SETUP = """
import os


def setup_single_controller(master_config, tokenizer, *, processor=None, partition_id="rollout_data"):
    return {"settings": os.environ.get("NEMO_RL_ATTN_ALIGN_SETTINGS")}, {"timings": 0}
"""
OTHER_SIGNATURE = "def setup_single_controller(config, *args):\n    return None\n"


def _tree(root, setup_source):
    package = root / "nemo_rl" / "algorithms" / "single_controller_utils"
    package.mkdir(parents=True)
    for folder in (root / "nemo_rl", root / "nemo_rl" / "algorithms"):
        (folder / "__init__.py").write_text("")
    (package / "__init__.py").write_text(
        "from nemo_rl.algorithms.single_controller_utils.setup import setup_single_controller\n"
    )
    (package / "setup.py").write_text(textwrap.dedent(setup_source))
    return root


@pytest.fixture
def driver(bootstrap_state, monkeypatch):
    for name in (handoff.SETTINGS_ENV, handoff.REPORT_DIR_ENV, handoff.STRICT_ENV):
        monkeypatch.delenv(name, raising=False)
    bootstrap_state.deactivate()
    bootstrap_state.activate("test")
    yield
    nemo_rl_driver.detach()
    os.environ.pop(handoff.SETTINGS_ENV, None)


def test_setup_single_controller_is_checked_and_reported_as_grpo(driver, tmp_path, capsys):
    with standin(_tree(tmp_path / "src", SETUP), "nemo_rl"):
        from nemo_rl.algorithms.single_controller_utils import setup as module
        from nemo_rl.algorithms.single_controller_utils import setup_single_controller  # as the example does

        assert (
            _patching.is_wrapped(setup_single_controller) and setup_single_controller is module.setup_single_controller
        )
        args, _ = setup_single_controller(master_config(tmp_path), None)
        assert handoff.WorkerSettings(**json.loads(args["settings"])).run_id == driver_report.current.run.run_id
        assert "nemo-rl-attn-align report: verdict" in capsys.readouterr().out  # collected when setup returned
        with pytest.raises(RuleViolation):  # the pre-flight rules run before the original
            setup_single_controller(master_config(tmp_path, precision="float32"), None)


def test_a_setup_single_controller_of_another_signature_is_one_warning(driver, tmp_path, caplog):
    with standin(_tree(tmp_path / "src", OTHER_SIGNATURE), "nemo_rl"):
        with caplog.at_level("WARNING", logger="nemo_rl_attn_align"):
            from nemo_rl.algorithms.single_controller_utils import setup_single_controller
        assert not _patching.is_wrapped(setup_single_controller)
    assert any(
        "setup_single_controller(master_config, tokenizer, ...) not found" in r.getMessage() for r in caplog.records
    )
