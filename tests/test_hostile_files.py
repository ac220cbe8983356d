"""Hostile files and values at every input path: one line, exit 2 (or a finding), nothing half-done.

CONFIG, overrides, record and report files, ``drift --out``: each limit of ``limits`` is hit with
a real file (FIFOs, devices, symlink loops, alias bombs, deep nesting) through the real loaders
and CLI handlers. Timings and memory of the same cases are measured by
``benchmarks/fuzz_check.py --hostile``, not here.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from nemo_rl_attn_align.cli import main
from nemo_rl_attn_align.config.example_recipes import default_example_path
from nemo_rl_attn_align.config.loader import load_config
from nemo_rl_attn_align.report.load import ReportError, load_report
from nemo_rl_attn_align.report.store import (
    read_worker_files,
    remove_stale_temp_files,
    worker_record_path,
    write_worker_record,
)
from nemo_rl_attn_align.vocab import limits
from nemo_rl_attn_align.vocab.errors import UsageError

from .contract_samples import full_contract
from .hostile_inputs import strict_json_loads

EXAMPLE = default_example_path()


def usage_error(path, overrides=()) -> str:
    with pytest.raises(UsageError) as info:
        load_config(path, overrides)
    message = str(info.value)
    assert "\n" not in message
    return message


def alias_bomb(levels: int) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("levels", [6, 9])
def test_alias_bomb_is_refused_before_it_is_built(tmp_path, levels):
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb(levels))
    assert f"more than {limits.MAX_CONFIG_NODES} values" in usage_error(path)


def test_aliases_within_the_limit_still_load(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("base: &b {x: 1, y: [1, 2]}\nother: *b\n")
    assert load_config(path)["other"] == {"x": 1, "y": [1, 2]}


@pytest.mark.parametrize(
    "text, expected",
    [
        ("a: &a [*a]\n", "refers to its own anchor"),
        ("a: " + "[" * 5000 + "]" * 5000 + "\n", f"deeper than {limits.MAX_NESTING} levels"),
        ("".join(" " * i + f"k{i}:\n" for i in range(100)), f"deeper than {limits.MAX_NESTING} levels"),
        (
            "".join(f"k{i}: {i}\n" for i in range(limits.MAX_CONFIG_NODES)),
            f"more than {limits.MAX_CONFIG_NODES} values",
        ),
    ],
)
def test_structure_limits(tmp_path, text, expected):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert expected in usage_error(path)


def test_file_size_limit_is_checked_before_reading(tmp_path):
    path = tmp_path / "big.yaml"
    with open(path, "w") as handle:
        handle.write("a: '")
        handle.seek(limits.MAX_CONFIG_BYTES + 10)
        handle.write("'\n")
    assert f"over the limit of {limits.MAX_CONFIG_BYTES}" in usage_error(path)


def test_non_regular_files_and_unopenable_paths(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "loop_a").symlink_to(tmp_path / "loop_b")
    (tmp_path / "loop_b").symlink_to(tmp_path / "loop_a")
    assert "FIFO" in usage_error(fifo)  # opened without blocking
    assert "character device" in usage_error("/dev/zero")
    assert "is a directory" in usage_error(tmp_path)
    assert "symbolic links" in usage_error(tmp_path / "loop_a")
    assert "cannot be opened" in usage_error(tmp_path / ("x" * 300 + ".yaml"))
    assert "does not exist" in usage_error(tmp_path / "missing.yaml")


def test_defaults_chain_is_bounded(tmp_path):
    for i in range(limits.MAX_DEFAULTS_FILES + 1):
        (tmp_path / f"c{i}.yaml").write_text(f"defaults: c{i + 1}.yaml\nk{i}: 1\n")
    assert f"more than {limits.MAX_DEFAULTS_FILES} files" in usage_error(tmp_path / "c0.yaml")


@pytest.mark.parametrize(
    "override, expected",
    [
        ("++" + ".".join(["a"] * 600) + "=1", "600 levels"),
        ("++a=" + "[" * 100 + "]" * 100, f"deeper than {limits.MAX_NESTING} levels"),
        ("++a=" + "x" * (limits.MAX_OVERRIDE_CHARS + 1), "over the limit"),
        (
            "++policy.megatron_cfg.model_overrides=[] ++policy.megatron_cfg.model_overrides.cp_comm_type=a2a",
            "cannot be applied",
        ),
    ],
)
def test_override_limits(override, expected):
    assert expected in usage_error(EXAMPLE, override.split(" "))


def _list(elements: int) -> str:
    return "[" + ",".join(["1"] * elements) + "]"


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            ["policy.precision=bfloat16"] * (limits.MAX_OVERRIDES + 1),
            f"{limits.MAX_OVERRIDES + 1} overrides, over the limit of {limits.MAX_OVERRIDES}. Fix: put the settings",
        ),
        (
            [f"++s{i}='{'a' * 9_000}'" for i in range(8)],
            f"characters in all, over the limit of {limits.MAX_OVERRIDES_TOTAL_CHARS}. Fix: put large values",
        ),
        (
            [f"++x={_list(limits.MAX_OVERRIDE_ELEMENTS + 2)}"],  # 4,900 elements took 2.4 s to parse
            f"hold {limits.MAX_OVERRIDE_ELEMENTS + 1} list, mapping or sweep elements in all",
        ),
        (  # the elements of all overrides count together
            [f"++x{i}={_list(limits.MAX_OVERRIDE_ELEMENTS // 4 + 2)}" for i in range(4)],
            f"over the limit of {limits.MAX_OVERRIDE_ELEMENTS}. Fix: put long lists in the YAML file",
        ),
    ],
    ids=["count", "total-chars", "one-long-list", "elements-in-all"],
)
def test_override_set_limits_refuse_before_any_is_parsed(overrides, expected):
    start = time.perf_counter()
    assert expected in usage_error(EXAMPLE, overrides)
    assert time.perf_counter() - start < 2  # 10,000 overrides took 3.4 s, a 4,900-element list 2.4 s


def test_override_sets_within_the_limits_still_apply():
    quoted = "'" + ",".join(["a"] * (limits.MAX_OVERRIDE_ELEMENTS + 100)) + "'"  # commas inside quotes are text
    cfg = load_config(
        EXAMPLE,
        [
            "policy.precision=bfloat16",
            "++policy.megatron_cfg.context_parallel_size=2",
            f"++x={_list(limits.MAX_OVERRIDE_ELEMENTS + 1)}",  # exactly the limit: 1,000 commas
            f"++note={quoted}",
            "~policy.megatron_cfg.moe_per_layer_logging",
        ],
    )
    assert cfg["policy"]["megatron_cfg"]["context_parallel_size"] == 2
    assert len(cfg["x"]) == limits.MAX_OVERRIDE_ELEMENTS + 1 and cfg["note"].count(",") > 1000
    assert "moe_per_layer_logging" not in cfg["policy"]["megatron_cfg"]
    many = load_config(EXAMPLE, ["policy.precision=float16"] * limits.MAX_OVERRIDES)
    assert many["policy"]["precision"] == "float16"


def test_too_many_overrides_is_one_line_and_exit_2_from_the_cli(capsys):
    code, out, err = run_cli(capsys, "check", str(EXAMPLE), *["policy.precision=bfloat16"] * 10_000)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("error: 10000 overrides, over the limit of 1000.")


@pytest.mark.parametrize(
    "override, expected",
    [
        ("policy.megatron_cfg={a:1}", "policy.megatron_cfg is in the config but this value cannot replace it"),
        ("policy.megatron_cfg.enabled.x=1", "policy.megatron_cfg.enabled holds a value, not a mapping"),
        (
            "policy.megatron_cfg.nope=1",
            "policy.megatron_cfg.nope is not in the config; write ++policy.megatron_cfg.nope=VALUE",
        ),
    ],
)
def test_override_hints_match_what_is_in_the_config(override, expected):
    assert expected in usage_error(EXAMPLE, [override])


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_error_lines_cut_huge_values_and_escape_newlines(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(f"defaults: {EXAMPLE}\nattention_align:\n  on_mismatch: '{'v' * 200_000}'\n  \"bad\\nkey\": 1\n")
    code, out, err = run_cli(capsys, "check", str(path))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert len(err) < 3000 and "(200002 chars)" in err and "bad\\nkey" in err


def test_check_json_never_prints_nan(capsys):
    code, out, _ = run_cli(
        capsys,
        "check",
        "--json",
        str(EXAMPLE),
        "++policy.megatron_cfg.attention_backend=nan",
        "++policy.megatron_cfg.model_overrides.softmax_scale=inf",
    )
    doc = strict_json_loads(out)
    assert code == 1 and doc["plan"]["requested"] == "nan"


def test_unknown_cp_comm_type_under_cp_is_a_finding_not_a_traceback(capsys):
    code, out, _ = run_cli(
        capsys,
        "check",
        "--json",
        str(EXAMPLE),
        "++policy.megatron_cfg.context_parallel_size=2",
        "++policy.megatron_cfg.model_overrides.cp_comm_type=bogus",
    )
    doc = json.loads(out)
    assert code == 1
    assert [f["key"] for f in doc["plan"]["findings"] if f["code"] == "CONFIG_VALUE_INVALID"] == [
        "policy.megatron_cfg.model_overrides.cp_comm_type"
    ]


@pytest.mark.parametrize("value", ["true", "'32'", "2.0", "0"])
def test_drift_settings_refuse_coercible_values(capsys, value):
    code, _, err = run_cli(capsys, "check", str(EXAMPLE), f"++attention_align.drift.heads={value}")
    assert code == 2 and "attention_align.drift.heads" in err and err.count("\n") == 1


def test_report_dir_is_normalised(capsys, tmp_path):
    code, out, _ = run_cli(capsys, "check", "--json", str(EXAMPLE), f"++attention_align.report_dir={tmp_path}/X/../Y")
    assert code == 0
    assert json.loads(out)["attention_align"]["settings"]["report_dir"] == f"{tmp_path}/Y"


# --- records and reports -------------------------------------------------------------------------


def detail(**extra) -> str:
    return json.dumps({"kind": "nemo-rl-attn-align/host-detail", "side": "training", "worker_id": "w", **extra})


def test_bad_record_files_are_listed_as_unreadable_and_the_rest_goes_on(tmp_path):
    good = write_worker_record(tmp_path, full_contract("training", "policy-rank0"))
    hosts = tmp_path / "hosts"
    hosts.mkdir()
    for name, text in {
        "peers": detail(peers=5),
        "findings7": detail(findings=7),
        "oops": detail(findings="oops"),
        "peer_int": detail(peers=[1]),
    }.items():
        (hosts / f"training--{name}.json").write_text(text)
    (tmp_path / "workers" / "training--deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "workers" / "training--version.json").write_text(
        json.dumps({"kind": "nemo-rl-attn-align/worker", "schema_version": 1.0})
    )
    (tmp_path / "workers" / "training--big.json").write_text(" " * (limits.MAX_RECORD_BYTES + 1))
    os.mkfifo(tmp_path / "workers" / "training--fifo.json")
    (tmp_path / "workers" / "training--zero.json").symlink_to("/dev/zero")
    files = read_worker_files(tmp_path)
    assert [r.worker_id for r in files.records] == ["policy-rank0"] and good.exists()
    assert len(files.unreadable) == 9
    assert all("\n" not in item.error for item in files.unreadable)


@pytest.mark.parametrize(
    "text, expected",
    [
        (json.dumps({"kind": "nemo-rl-attn-align/report", "schema_version": 1.0}), "schema_version 1.0"),
        (json.dumps({"kind": "nemo-rl-attn-align/report", "schema_version": True}), "schema_version True"),
        ("[" * 100_000 + "]" * 100_000, "nests deeper"),
    ],
)
def test_report_file_limits(tmp_path, text, expected):
    path = tmp_path / "r.json"
    path.write_text(text)
    with pytest.raises(ReportError, match=expected):
        load_report(path)


@pytest.mark.parametrize("kind", ["fifo", "dev", "loop", "long"])
def test_report_refuses_unreadable_paths_at_once(tmp_path, capsys, kind):
    path = {"fifo": tmp_path / "fifo", "dev": "/dev/zero", "loop": tmp_path / "loop", "long": tmp_path / ("r" * 300)}[
        kind
    ]
    if kind == "fifo":
        os.mkfifo(path)
    if kind == "loop":
        path.symlink_to(path)
    start = time.monotonic()
    code, out, err = run_cli(capsys, "report", str(path))
    assert code == 2 and out == "" and err.count("\n") == 1 and time.monotonic() - start < 30  # never hangs


def test_long_worker_ids_keep_their_record(tmp_path):
    worker_id = "policy-" + "r" * 400
    path = write_worker_record(tmp_path, full_contract("training", worker_id))
    assert len(path.name) <= 200 and path == worker_record_path(tmp_path, "training", worker_id)
    assert [r.worker_id for r in read_worker_files(tmp_path).records] == [worker_id]


def test_stale_temp_files_are_ignored_and_removed_when_old(tmp_path):
    write_worker_record(tmp_path, full_contract("training", "policy-rank0"))
    old, fresh = tmp_path / "workers" / ".training--x.json.abc.tmp", tmp_path / "workers" / ".training--y.json.def.tmp"
    old.write_text('{"half')
    fresh.write_text('{"half')
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    files = read_worker_files(tmp_path)
    assert len(files.records) == 1 and files.unreadable == () and len(files.incomplete_writes) == 2
    assert remove_stale_temp_files(tmp_path) == [str(old)]
    assert not old.exists() and fresh.exists()


# --- drift --out ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "out, expected",
    [
        ("afile", "is a file"),
        ("afile/sub", "afile is a file"),
        ("o" * 300, "over the file system's limit"),
        ("/proc/x/y", "cannot be created in /proc"),
    ],
)
def test_drift_out_is_checked_before_the_sweep(tmp_path, capsys, out, expected):
    (tmp_path / "afile").write_text("x")
    target = out if out.startswith("/") else str(tmp_path / out)
    code, stdout, err = run_cli(
        capsys, "drift", "--heads", "2", "--head-dim", "8", "--seq-len", "16", "--no-progress", "--out", target
    )
    assert code == 2 and stdout == "" and expected in err and err.count("\n") == 1


# --- the environment the driver hands to workers --------------------------------------------------


@pytest.mark.parametrize("raw", ["[" * 100_000, '{"strict": "false", "report_dir": 5}', "null", "\x00"])
def test_worker_settings_from_a_hostile_environment_fall_back_to_defaults(raw):
    from nemo_rl_attn_align.hosts import handoff

    settings = handoff.worker_settings({handoff.SETTINGS_ENV: raw})
    assert settings == handoff.WorkerSettings()
