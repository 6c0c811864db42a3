"""The host side never trusts what a trainer left in its directories (issue 21, items 1 to 3):
links are refused, never followed; FIFOs and devices are refused without blocking; sizes are
bounded. Real files, links and FIFOs in a temporary directory; no Docker."""

import os
import threading

import pytest

from aiptrain import safe_files
from aiptrain.safe_files import UnsafePath


@pytest.fixture
def secret(tmp_path):
    """A root-only directory and file outside the trainer's directory, as a link would aim at."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "secret").write_text("root only\n")
    return private


def owner(path):
    info = os.stat(path, follow_symlinks=False)
    return info.st_uid, info.st_gid


def test_make_dirs_creates_and_hands_the_last_directory_over(tmp_path):
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    made = safe_files.make_dirs(job_dir, "3/inner", (65534, 65534) if os.getuid() == 0 else None)
    assert made.is_dir()
    if os.getuid() == 0:
        assert owner(made) == (65534, 65534)
        assert owner(job_dir / "3") == (0, 0)
    safe_files.make_dirs(job_dir, "3/inner")  # exists: fine


@pytest.mark.parametrize("planted", ["3", "3/inner"])
def test_make_dirs_refuses_a_link_a_trainer_planted_and_leaves_its_target_alone(tmp_path, secret, planted):
    job_dir = tmp_path / "job"
    (job_dir / "3").mkdir(parents=True)
    link = job_dir / planted
    if planted == "3":
        (job_dir / "3").rmdir()
    link.symlink_to(secret)
    before = owner(secret), oct(secret.stat().st_mode)
    with pytest.raises(UnsafePath, match="not a directory"):
        safe_files.make_dirs(job_dir, "3/inner", (65534, 65534))
    assert (owner(secret), oct(secret.stat().st_mode)) == before
    assert sorted(p.name for p in secret.iterdir()) == ["secret"]


def test_read_file_reads_a_regular_file_and_refuses_links(tmp_path, secret):
    (tmp_path / "plain").write_text("0.5\n")
    assert safe_files.read_file(tmp_path, "plain", 100) == b"0.5\n"
    assert safe_files.read_file(tmp_path, "absent", 100) is None
    (tmp_path / "link").symlink_to(secret / "secret")
    with pytest.raises(UnsafePath, match="is a link"):
        safe_files.read_file(tmp_path, "link", 100)
    (tmp_path / "dir-link").symlink_to(secret)
    with pytest.raises(UnsafePath):
        safe_files.read_file(tmp_path, "dir-link/secret", 100)
    (tmp_path / "zero").symlink_to("/dev/zero")
    with pytest.raises(UnsafePath):
        safe_files.read_file(tmp_path, "zero", 100)


def test_read_file_refuses_a_fifo_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    outcome = []

    def read():
        try:
            safe_files.read_file(tmp_path, "fifo", 100)
        except UnsafePath as exc:
            outcome.append(str(exc))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(30)  # a blocking open never returns: the join would end with the thread alive
    if reader.is_alive():  # unblock it, so the test process can end
        os.close(os.open(tmp_path / "fifo", os.O_WRONLY | os.O_NONBLOCK))
    assert outcome and "not a regular file" in outcome[0]


def test_read_file_refuses_a_file_over_its_bound(tmp_path):
    (tmp_path / "big").write_bytes(b"x" * 101)
    with pytest.raises(UnsafePath, match="larger than 100 bytes"):
        safe_files.read_file(tmp_path, "big", 100)


def test_find_files_never_descends_through_a_link(tmp_path, secret):
    (tmp_path / "trial" / "train").mkdir(parents=True)
    (tmp_path / "trial" / "train" / "events.out.tfevents.1").write_bytes(b"")
    (secret / "events.out.tfevents.2").write_bytes(b"")
    (tmp_path / "trial" / "elsewhere").symlink_to(secret)
    found = [relative for relative, _, _ in safe_files.find_files(tmp_path, "trial", lambda n: "tfevents" in n)]
    assert found == ["train/events.out.tfevents.1"]
    assert list(safe_files.find_files(tmp_path, "trial/elsewhere", lambda n: True)) == []
