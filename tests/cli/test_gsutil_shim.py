"""gs:// kept on this machine end to end: the gsutil shim (and the gcloud shim's `gcloud
storage`) puts a pipeline's data in a bucket, the trainer reads and writes the same gs:// URLs
through the storage endpoint, and its outputs come back."""

import os
import subprocess
import sys
import textwrap

import pytest

from aiptrain.cli.gsutil import GsutilError, LocalGcs, run, strip_top_level


@pytest.fixture
def gcs(tmp_path):
    return LocalGcs(tmp_path / "gcs")


def test_mb_cp_ls_cat_rm_rb_behave_as_gsutil(gcs, tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.csv").write_text("1,2\n")
    (data / "eval.csv").write_text("3,4\n")
    run(gcs, "mb", ["-l", "us-central1", "gs://my-bucket"])
    with pytest.raises(GsutilError, match="ServiceException: 409"):
        run(gcs, "mb", ["gs://my-bucket"])
    with pytest.raises(GsutilError, match=r"Omitting directory .* cp -r"):
        run(gcs, "cp", [str(data), "gs://my-bucket/"])
    run(gcs, "cp", ["-r", str(data), "gs://my-bucket/"])
    run(gcs, "cp", [str(data / "train.csv"), "gs://my-bucket/copy.csv"])
    capsys.readouterr()
    run(gcs, "ls", ["gs://my-bucket"])
    assert capsys.readouterr().out.splitlines() == ["gs://my-bucket/copy.csv", "gs://my-bucket/data/"]
    run(gcs, "ls", ["-r", "gs://my-bucket/data"])
    assert capsys.readouterr().out.splitlines() == ["gs://my-bucket/data/eval.csv", "gs://my-bucket/data/train.csv"]
    run(gcs, "cat", ["gs://my-bucket/data/*.csv"])
    assert capsys.readouterr().out == "3,4\n1,2\n"
    run(gcs, "cp", ["gs://my-bucket/data/*", str(tmp_path / "back") + "/"])
    assert sorted(p.name for p in (tmp_path / "back").iterdir()) == ["eval.csv", "train.csv"]
    with pytest.raises(GsutilError, match="NotFoundException: 404 gs://other-bucket"):
        run(gcs, "cp", [str(data / "train.csv"), "gs://other-bucket/x"])
    with pytest.raises(GsutilError, match="without -r"):
        run(gcs, "rm", ["gs://my-bucket/data"])
    with pytest.raises(GsutilError, match="BucketNotEmpty"):
        run(gcs, "rb", ["gs://my-bucket"])
    run(gcs, "rm", ["-r", "gs://my-bucket/*"])
    run(gcs, "rb", ["gs://my-bucket"])
    run(gcs, "rm", ["-f", "gs://my-bucket/none"])  # -f: a missing object is no error
    with pytest.raises(GsutilError, match="No URLs matched"):
        run(gcs, "cat", ["gs://my-bucket/none"])


def test_ls_l_is_the_long_listing_and_ls_gs_lists_the_buckets(gcs, tmp_path, capsys):
    """`-l` is mb's location but ls's long listing: it never takes the URL after it."""
    (tmp_path / "x.txt").write_text("twelve bytes")
    run(gcs, "mb", ["-l", "us-central1", "gs://my-bucket"])
    run(gcs, "mb", ["gs://other-bucket"])
    run(gcs, "cp", [str(tmp_path / "x.txt"), "gs://my-bucket/d/x.txt"])
    capsys.readouterr()
    run(gcs, "ls", ["-l", "gs://my-bucket/d/x.txt"])
    assert capsys.readouterr().out.split() == ["12", "gs://my-bucket/d/x.txt"]
    for listing in ([], ["gs://"]):
        run(gcs, "ls", listing)
        assert capsys.readouterr().out.split() == ["gs://my-bucket/", "gs://other-bucket/"]


def test_paths_cannot_leave_the_bucket(gcs):
    from aiptrain.errors import ValidationError

    run(gcs, "mb", ["gs://my-bucket"])
    with pytest.raises(ValidationError, match=r"'\.\.' segment"):
        run(gcs, "cp", ["/etc/hostname", "gs://my-bucket/../../escape"])


def test_top_level_options_are_dropped():
    assert strip_top_level(["-m", "-o", "GSUtil:parallel=1", "-q", "cp", "-r", "a", "gs://b"]) == [
        "cp", "-r", "a", "gs://b"]


def test_gcloud_storage_spells_the_same_commands_long(gcs, tmp_path, capsys):
    from aiptrain.cli.gsutil import gcloud_storage_args

    assert gcloud_storage_args(["buckets", "create", "gs://b", "--location", "us-east1"]) == ("mb", ["gs://b"])
    assert gcloud_storage_args(["cp", "--recursive", "--no-clobber", "d", "gs://b/"]) == (
        "cp", ["-r", "-n", "d", "gs://b/"])
    assert gcloud_storage_args(["rm", "--recursive", "--continue-on-error", "gs://b/x"]) == ("rm", ["-r", "gs://b/x"])
    assert gcloud_storage_args(["ls", "--long", "gs://b"]) == ("ls", ["-l", "gs://b"])
    with pytest.raises(Exception, match=r"runs cp, mv, ls, cat, rm and buckets create .* not `objects describe`"):
        gcloud_storage_args(["objects", "describe", "gs://b/x"])


def test_gcloud_storage_through_the_shim_stages_and_reads_back(home, tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    subprocess.run([sys.executable, "-m", "aiptrain", "gcloud-shim", "install", str(bin_dir)], check=True,
                   capture_output=True)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.csv").write_text("1,2\n")
    script = tmp_path / "stage.sh"
    script.write_text(textwrap.dedent(f"""\
        set -euo pipefail
        gcloud storage buckets create gs://stage-me --location=us-central1
        gcloud storage cp --recursive {tmp_path}/data gs://stage-me/
        gcloud storage ls --recursive gs://stage-me
        gcloud storage cat gs://stage-me/data/train.csv
        gcloud storage cp gs://stage-me/data/train.csv {tmp_path}/back.csv
        gcloud storage rm --recursive gs://stage-me/data
        gcloud storage ls gs://stage-me/data || echo "gone with $?"
        gcloud storage buckets create gs://stage-me || echo "again: $?"
        """))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "AIPTRAIN_GCS": "local"}
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["gs://stage-me/data/train.csv", "1,2", "gone with 1", "again: 1"]
    assert (tmp_path / "back.csv").read_text() == "1,2\n"
    assert "ERROR: (gcloud.storage.ls) No URLs matched: gs://stage-me/data" in result.stderr
    assert "ERROR: (gcloud.storage.buckets.create) 409 A Cloud Storage bucket named 'stage-me' already exists." \
        in result.stderr
    assert (home / "gcs" / "stage-me").is_dir() and not (home / "gcs" / "stage-me" / "data").exists()


