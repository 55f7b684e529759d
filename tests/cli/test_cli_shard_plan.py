"""`ucstage` basics and `ucstage shard-plan`, run as a user runs them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from ucstage import __version__
from ucstage.cli import cli
from ucstage.manifest import save, snapshot


def run(*args: str, input: str | None = None):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False, input=input)


@pytest.fixture
def vol(tmp_path):
    root = tmp_path / "vol"
    root.mkdir()
    for i in range(23):
        (root / f"f{i:02d}.bin").write_bytes(b"x" * (i + 1))
    (root / "_SUCCESS").write_bytes(b"")
    return str(root)


def _commands(group: click.Group, prefix: str = ""):
    for name, cmd in group.commands.items():
        yield prefix + name, cmd
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, prefix + name + " ")


def test_every_command_has_help_with_an_example():
    names = [name for name, _ in _commands(cli)]
    assert "shard-plan" in names
    for name, cmd in _commands(cli):
        assert cmd.help and len(cmd.help) > 40, f"{name} has no real help text"
        if not isinstance(cmd, click.Group):
            assert "Example" in cmd.help, f"{name} help has no example"
        result = run(*name.split(), "--help")
        assert result.exit_code == 0 and "Usage:" in result.output


def test_version_and_python_m():
    assert run("--version").output.strip() == f"ucstage, version {__version__}"
    proc = subprocess.run([sys.executable, "-m", "ucstage", "--help"], capture_output=True,
                          text=True)
    assert proc.returncode == 0 and "shard-plan" in proc.stdout


def test_help_does_not_import_heavy_dependencies():
    code = ("import sys; from ucstage.cli import cli; "
            "print(sorted(m for m in ('torch', 'pyspark', 'mlflow', 'deltalake') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    assert out.strip() == "[]"


def test_consistent_plan_human_output(vol):
    result = run("shard-plan", vol, "-w", "2", "-k", "3", "--batch-size", "4")
    assert result.exit_code == 0, result.output
    assert "23 (" in result.output and "6 slots" in result.output
    assert "every file is read exactly once" in result.output


def test_json_contract(vol):
    result = run("shard-plan", vol, "-w", "2", "-k", "3", "--batch-size", "2", "--json")
    assert result.exit_code == 0
    data = json.loads(result.output)
    for key in ("world_size", "num_workers", "fingerprint", "slots", "duplicated", "skipped",
                "batches", "summary", "ranks"):
        assert key in data
    assert data["world_size"] == 2 and data["num_workers"] == [3, 3]
    assert [(s["rank"], s["worker"]) for s in data["slots"]] == [(r, w) for r in range(2) for w in range(3)]
    assert data["slots"][0]["files"] == ["f00.bin", "f06.bin", "f12.bin", "f18.bin"]
    assert data["slots"][0]["bytes"] == 1 + 7 + 13 + 19
    assert sorted(f for s in data["slots"] for f in s["files"]) == [f"f{i:02d}.bin" for i in range(23)]
    assert data["duplicated"] == [] and data["skipped"] == []
    # files per worker: rank 0 -> 4,4,4 ; rank 1 -> 4,4,3 ; batches of 2
    assert data["batches"] == [6, 6]
    assert data["fingerprint"] == snapshot(vol).fingerprint
    assert "empty_slots" not in data  # a plan where every slot reads keeps its old shape
    assert data["summary"]["slots"] == 6


def test_more_slots_than_files_warns_and_exits_1(vol):
    """23 files over 10 ranks x 3 workers: 7 slots read nothing, 2 ranks get no file."""
    human = run("shard-plan", vol, "-w", "10", "-k", "3")
    assert human.exit_code == 1, human.output
    assert "every file is read exactly once" not in human.output
    assert "7 of 30 slots read nothing" in human.output
    assert "2 ranks get no file at all" in human.output
    assert "7:2 .. 9:2" in human.output and "use at most 23 slots" in human.output
    assert "error: 7 of 30 slots read nothing" in human.stderr
    result = run("shard-plan", vol, "-w", "10", "-k", "3", "--json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["consistent"] is True and data["summary"]["slots"] == 30
    assert len(data["slots"]) == 23 and all(s["files"] for s in data["slots"])
    assert data["empty_slots"] == {"count": 7, "ranks": 2, "ranges_not_listed": 0,
                                   "ranges": [{"first": [7, 2], "last": [9, 2], "slots": 7}]}
    assert [r["rank"] for r in data["ranks"]] == list(range(8))
    assert data["num_workers"] == [3] * 8
    assert data["summary"]["files_per_slot"]["min"] == 0


def test_huge_world_size_plans_by_file(tmp_path):
    """-w 100000000 -k 100 on 250 files grew to all the RAM; now it plans the 250 files."""
    root = tmp_path / "small"
    root.mkdir()
    for i in range(250):
        (root / f"{i:03d}.bin").write_bytes(b"x")
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (2**31, 2**31)); "
            "from ucstage.cli import main; main(sys.argv[1:])")
    proc = subprocess.run([sys.executable, "-c", code, "shard-plan", str(root), "-w",
                           "100000000", "-k", "100", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    assert data["empty_slots"]["count"] == 10**10 - 250 and len(data["slots"]) == 250
    assert "slots read nothing" in proc.stderr


def test_a_slot_that_reads_nothing_prints_no_files(vol):
    result = run("shard-plan", vol, "-w", "10", "-k", "3", "--slot", "9:2")
    assert result.exit_code == 0 and result.stdout == ""
    assert "slot 9:2: 0 files" in result.stderr


@pytest.mark.parametrize("extra", [["--seed", "3"], ["--epoch", "1"], ["--seed", "0"],
                                   ["--epoch", "2", "--slot", "0:0"]])
def test_seed_or_epoch_without_shuffle_is_refused(vol, extra):
    proc = subprocess.run([sys.executable, "-m", "ucstage", "shard-plan", vol, "-w", "2", "-k",
                           "2", *extra], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert "--seed/--epoch only matter with --shuffle" in proc.stderr
    assert f"leave {extra[0]} out" in proc.stderr
    assert run("shard-plan", vol, "-w", "2", "-k", "2", "--shuffle", *extra).exit_code == 0


def test_mismatch_names_duplicates_and_skips_and_exits_1(vol):
    result = run("shard-plan", vol, "-w", "2", "-k", "3,2", "--json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["num_workers"] == [3, 2] and not data["consistent"]
    reads: dict[str, int] = {}
    for s in data["slots"]:
        for f in s["files"]:
            reads[f] = reads.get(f, 0) + 1
    assert data["duplicated"] == sorted(f for f, c in reads.items() if c > 1)
    assert data["skipped"] == sorted({f"f{i:02d}.bin" for i in range(23)} - set(reads))
    human = run("shard-plan", vol, "-w", "2", "-k", "3,2")
    assert human.exit_code == 1
    assert f"{len(data['duplicated'])} files are read twice or more" in human.output
    assert data["duplicated"][0] in human.output


def test_unequal_batches_warn_and_exit_1(vol):
    # 23 files over 4 slots of one worker: 6,6,6,5 files -> with B=3 ranks get 2,2,2,2;
    # with B=2 they get 3,3,3,3; with B=6: 1,1,1,1; use B=5: 2,2,2,1.
    result = run("shard-plan", vol, "-w", "4", "-k", "0", "--batch-size", "5")
    assert result.exit_code == 1
    assert "different batch counts" in result.output
    assert 'VolumeDataset(equal_length="pad")' in result.output


def test_slot_prints_files_in_read_order(vol, tmp_path):
    result = run("shard-plan", vol, "-w", "2", "-k", "2", "--slot", "1:1")
    assert result.exit_code == 0
    assert result.stdout.split() == [f"f{i:02d}.bin" for i in range(3, 23, 4)]
    shuffled = json.loads(run("shard-plan", vol, "-w", "2", "-k", "2", "--shuffle", "--seed", "3",
                              "--slot", "0:0", "--json").output)
    assert shuffled["rank"] == 0 and len(shuffled["files"]) == 6
    assert shuffled["files"] != [f"f{i:02d}.bin" for i in range(0, 23, 4)]


def test_manifest_as_source_and_option(vol, tmp_path):
    path = save(snapshot(vol), tmp_path / "m.json")
    os.remove(os.path.join(vol, "f00.bin"))
    for args in ([str(path)], ["--manifest", str(path)]):
        data = json.loads(run("shard-plan", *args, "-w", "1", "-k", "1", "--json").output)
        assert data["slots"][0]["files"][0] == "f00.bin"


def test_large_plan_stays_readable(tmp_path):
    root = tmp_path / "big"
    root.mkdir()
    for i in range(300):
        (root / f"{i:04d}").write_bytes(b"")
    result = run("shard-plan", str(root), "-w", "50", "-k", "6")  # 300 slots, 1 file each
    assert result.exit_code == 0
    assert len(result.output.splitlines()) < 40
    assert "more" in result.output


@pytest.mark.parametrize(("args", "needle"), [
    (["-w", "0", "-k", "1"], "--world-size must be at least 1"),
    (["-w", "2", "-k", "-1"], "--num-workers must be whole numbers >= 0"),
    (["-w", "3", "-k", "1,2"], "lists 2 values but --world-size is 3"),
    (["-w", "2", "-k", "x"], "separated by commas"),
    (["-w", "2", "-k", "2", "--slot", "9:0"], "no slot 9:0"),
    (["-w", "2", "-k", "2", "--slot", "zero"], "RANK:WORKER"),
])
def test_bad_input_exits_2_with_one_line(vol, args, needle):
    proc = subprocess.run([sys.executable, "-m", "ucstage", "shard-plan", vol, *args],
                          capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[0].startswith("error:")


def test_missing_empty_and_malformed_sources_exit_2(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad.json").write_text('{"format": "ucstage.manifest", "format_version": 1, "files": 3}')
    cases = {str(tmp_path / "nope"): "does not exist", str(tmp_path / "empty"): "no files to read",
             str(tmp_path / "bad.json"): "malformed"}
    for source, needle in cases.items():
        proc = subprocess.run([sys.executable, "-m", "ucstage", "shard-plan", source, "-w", "1",
                               "-k", "1"], capture_output=True, text=True)
        assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


def test_debug_shows_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ucstage", "--debug", "shard-plan",
                           str(tmp_path / "nope"), "-w", "1", "-k", "1"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" in proc.stderr


def test_errors_in_json_mode_are_json_too(vol):
    proc = subprocess.run([sys.executable, "-m", "ucstage", "shard-plan", vol, "-w", "0", "-k",
                           "1", "--json"], capture_output=True, text=True)
    assert proc.returncode == 2
    doc = json.loads(proc.stdout)
    assert doc["error"]["type"] == "InvalidArgument"
    assert doc["error"]["exit_code"] == 2 and "--world-size" in doc["error"]["message"]


def test_usage_errors_are_one_line_with_a_hint(vol):
    proc = subprocess.run([sys.executable, "-m", "ucstage", "shard-plan", vol, "-w", "2"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("error:") and "--num-workers" in lines[0]
    assert lines[1] == "hint: see `ucstage shard-plan --help`"


@pytest.mark.parametrize("extra", [["--include", "*.bin"], ["--all"]])
def test_filters_with_a_manifest_are_refused(vol, tmp_path, extra):
    path = save(snapshot(vol), tmp_path / "m.json")
    for args in ([str(path)], ["--manifest", str(path)]):
        result = run("shard-plan", *args, "-w", "1", "-k", "1", *extra)
        assert result.exit_code == 2 and "manifest is used as frozen" in result.output


def test_source_and_manifest_together_are_refused(vol, tmp_path):
    path = save(snapshot(vol), tmp_path / "m.json")
    result = run("shard-plan", vol, "--manifest", str(path), "-w", "1", "-k", "1")
    assert result.exit_code == 2 and "not both" in result.output


def test_broken_pipe_exits_like_shell_tools(tmp_path):
    root = tmp_path / "many"
    root.mkdir()
    for i in range(4000):
        (root / f"{i:05d}-a-long-enough-name-to-fill-the-pipe.bin").write_bytes(b"")
    proc = subprocess.Popen([sys.executable, "-m", "ucstage", "shard-plan", str(root), "-w", "1",
                             "-k", "1", "--slot", "0:0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # the reader leaves, as `| head -1` does
    _, stderr = proc.communicate()
    assert first.startswith(b"00000-")
    assert proc.returncode == 141, stderr
    assert b"Traceback" not in stderr


def test_unreachable_store_is_one_line(monkeypatch, tmp_path):
    # Not a live store: an endpoint nothing listens on and no credentials, so
    # the S3 client fails at once, before any request leaves the machine.
    env = {**os.environ, "UCSTAGE_VOLUMES_ROOT": "s3://ucstage-nowhere",
           "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        env.pop(key, None)
    proc = subprocess.run([sys.executable, "-m", "ucstage", "shard-plan", "/Volumes/c/s/v", "-w",
                           "1", "-k", "1"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "cannot read s3://ucstage-nowhere/c/s/v" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_dir_lists_the_public_api():
    import ucstage

    assert {"VolumeDataset", "DataLoader", "LocalCache", "export_table"} <= set(dir(ucstage))


def test_counts_of_one_are_singular(tmp_path: Path) -> None:
    """Issue 30 item 8: `1 ranks`, `the 1 files`, `1 slots` read as plurals."""
    root = tmp_path / "one"
    root.mkdir()
    (root / "only.bin").write_bytes(b"x" * 10)
    result = CliRunner().invoke(cli, ["shard-plan", str(root), "-w", "2", "-k", "1",
                                      "--nproc-per-node", "1"], env={"COLUMNS": "80"})
    out = " ".join(result.output.split())
    assert "2 x 1 rank per node" in out, out
    assert "(more slots than the 1 file); 1 rank gets no file at all" in out, out
    assert "1 rank read no file and is not listed" in out, out
    assert "1 node read no file and is not listed" in out, out
    for wrong in ("1 ranks", "1 files", "1 slots", "1 nodes"):
        # A count, not the last digit of the fingerprint printed before "files".
        assert re.search(rf"(?<![0-9a-f]){wrong}", out) is None, wrong
