"""aiptrain_compat, the module a runtime image imports at every start to give its trainers back
the names newer releases removed: its mechanisms on a made-up package in a fresh interpreter (the
real surfaces are checked inside the images at build and by tests/engine/test_old_runtimes.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from aiptrain.runtime import aiptrain_compat

COMPAT_DIR = Path(aiptrain_compat.__file__).parent


@pytest.fixture
def oldlib(tmp_path):
    """A package that moved `oldlib.forest` to `oldlib._forest`, and has `Frame` without `as_matrix`."""
    package = tmp_path / "oldlib"
    package.mkdir()
    (package / "__init__.py").write_text("class Frame:\n    values = [1, 2]\n")
    (package / "_forest.py").write_text("class Forest:\n    pass\n")
    return tmp_path


def run(oldlib: Path, script: str) -> subprocess.CompletedProcess:
    """`script` after the surface `test` of oldlib is installed, as the image's .pth line does."""
    prelude = textwrap.dedent("""
        import aiptrain_compat
        def patch(module):
            module.Frame.as_matrix = lambda self: self.values
        aiptrain_compat.SURFACES["test"] = ({"oldlib.forest": "oldlib._forest", "oldlib.vendored": "json"},
                                           {"oldlib": patch})
        aiptrain_compat.install("test", without_tensorflow="ERROR: no TensorFlow here: try 2.1.")
    """)
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(script)], capture_output=True, text=True,
                          env={"PYTHONPATH": f"{COMPAT_DIR}:{oldlib}"}, timeout=60)


def test_an_old_module_path_is_the_new_module_under_both_names(oldlib):
    result = run(oldlib, """
        from oldlib.forest import Forest
        import oldlib.forest, oldlib._forest
        from oldlib import forest
        print(oldlib.forest is oldlib._forest is forest, Forest.__module__)
    """)
    assert result.stdout == "True oldlib._forest\n", result.stderr


def test_an_alias_maps_submodules_and_from_imports(oldlib):
    result = run(oldlib, """
        from oldlib import vendored
        import oldlib.vendored.decoder as decoder, json.decoder
        print(vendored.__name__, decoder is json.decoder)
    """)
    assert result.stdout == "json True\n", result.stderr


def test_a_module_that_exists_wins_over_its_alias(oldlib):
    (oldlib / "oldlib" / "forest.py").write_text("OWN = True\n")  # a release that still has it (a trainer's pin)
    result = run(oldlib, "import oldlib.forest\nprint(oldlib.forest.OWN)")
    assert result.stdout == "True\n", result.stderr


def test_an_unknown_name_still_fails_as_python_says(oldlib):
    result = run(oldlib, "import oldlib.nothing")
    assert result.returncode == 1 and "ModuleNotFoundError: No module named 'oldlib.nothing'" in result.stderr


def test_an_attribute_is_set_when_its_module_is_imported(oldlib):
    result = run(oldlib, "import sys\nprint('oldlib' in sys.modules)\nimport oldlib\nprint(oldlib.Frame().as_matrix())")
    assert result.stdout == "False\n[1, 2]\n", result.stderr


def test_an_uncaught_tensorflow_import_ends_in_the_one_line(oldlib):
    result = run(oldlib, "import tensorflow as tf")
    assert (result.returncode, result.stderr) == (1, "ERROR: no TensorFlow here: try 2.1.\n")
    result = run(oldlib, "from tensorflow.keras import layers")
    assert (result.returncode, result.stderr) == (1, "ERROR: no TensorFlow here: try 2.1.\n")


def test_a_caught_tensorflow_import_and_other_errors_are_as_python_has_them(oldlib):
    result = run(oldlib, """
        try:
            import tensorflow
        except ImportError as error:
            print(type(error).__name__)
        raise ValueError("the trainer's own")
    """)
    assert result.stdout == "ModuleNotFoundError\n"
    assert result.stderr.startswith("Traceback") and result.stderr.endswith("ValueError: the trainer's own\n")


def test_every_surface_is_aliases_and_patches():
    for aliases, patches in aiptrain_compat.SURFACES.values():
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in aliases.items())
        assert all(callable(p) for p in patches.values())
    paths = aiptrain_compat.SURFACES["sklearn-paths"][0]
    assert len(paths) == 127
    assert paths["sklearn.ensemble.forest"] == "sklearn.ensemble._forest"
    assert paths["sklearn.cluster.k_means_"] == "sklearn.cluster._kmeans"
    assert paths["sklearn.cross_decomposition.cca_"] == "sklearn.cross_decomposition._pls"
