"""Installed into a runtime image whose frameworks are newer than the service's (runtimes 2.1-2.4
and 1.x): the names that version's trainers imported and those newer releases removed, so that
such trainers run unchanged. A `.pth` line imports it at every start of the image's Python and
calls `install` with the surfaces the catalog chose (aiptrain/runtime_catalog.py, COMPAT).

Runs inside the image, on its Python (3.9), beside nothing of aiptrain: standard library only.
Modules are given as aliases found last (a release that still has the module wins: a trainer
that pins scikit-learn 0.22 gets its own); attributes are set when their module is first imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

# scikit-learn 0.22 made these modules private (`sklearn.ensemble.forest` -> `sklearn.ensemble._forest`)
# and kept the old paths until 0.24 removed them; trainers of 0.20-0.23 imported them. Per package:
# the old names, each `old` (new: `_old` less a trailing `_`) or `old:new`. From scikit-learn
# 0.22.1's and 0.23.2's generated deprecation modules, every target checked against 0.24.2.
_SKLEARN_PATHS = {
    "cluster": "affinity_propagation_ bicluster birch dbscan_ hierarchical:_agglomerative k_means_:_kmeans "
               "mean_shift_ optics_ spectral",
    "covariance": "elliptic_envelope empirical_covariance_ graph_lasso_ robust_covariance shrunk_covariance_",
    "cross_decomposition": "cca_:_pls pls_",
    "datasets": "base california_housing covtype kddcup99 lfw olivetti_faces openml rcv1 samples_generator "
                "species_distributions svmlight_format:_svmlight_format_io twenty_newsgroups",
    "decomposition": "base cdnmf_fast dict_learning factor_analysis fastica_ incremental_pca kernel_pca nmf "
                     "online_lda:_lda online_lda_fast pca sparse_pca truncated_svd",
    "ensemble": "bagging base forest gradient_boosting:_gb iforest voting weight_boosting",
    "feature_extraction": "dict_vectorizer hashing:_hash stop_words",
    "feature_selection": "base from_model mutual_info rfe univariate_selection variance_threshold",
    "gaussian_process": "gpc gpr",
    "inspection": "partial_dependence",
    "linear_model": "base bayes cd_fast coordinate_descent huber least_angle logistic omp passive_aggressive "
                    "perceptron ransac ridge sag sag_fast sgd_fast stochastic_gradient theil_sen",
    "manifold": "isomap locally_linear mds spectral_embedding_ t_sne",
    "metrics": "base classification pairwise_fast ranking regression scorer",
    "metrics.cluster": "bicluster expected_mutual_info_fast supervised unsupervised",
    "mixture": "base bayesian_mixture gaussian_mixture",
    "neighbors": "ball_tree base classification dist_metrics graph kd_tree kde lof nca nearest_centroid quad_tree "
                 "regression typedefs unsupervised",
    "neural_network": "multilayer_perceptron rbm",
    "preprocessing": "data label",
    "semi_supervised": "label_propagation",
    "svm": "base bounds classes liblinear libsvm libsvm_sparse",
    "tree": "export tree:_classes",
    "utils": "fast_dict mocking seq_dataset testing weight_vector",
}


def _sklearn_paths() -> dict[str, str]:
    aliases = {}
    for package, names in _SKLEARN_PATHS.items():
        for entry in names.split():
            old, _, new = entry.partition(":")
            aliases[f"sklearn.{package}.{old}"] = f"sklearn.{package}.{new or '_' + old.rstrip('_')}"
    return aliases


def _as_matrix(self: Any, columns: Any = None) -> Any:
    """pandas before 1.0: `DataFrame.as_matrix(columns=None)`, the values of those columns."""
    return (self if columns is None else self[list(columns)]).values


def _get_value(self: Any, *key: Any, takeable: bool = False) -> Any:
    """pandas before 1.0: `get_value(index, col)` (`Series.get_value(label)`), one scalar by label."""
    return (self.iat if takeable else self.at)[key if len(key) > 1 else key[0]]


def _set_value(self: Any, *args: Any, takeable: bool = False) -> Any:
    """pandas before 1.0: `set_value(index, col, value)`; returns the object, as it did."""
    *key, value = args
    (self.iat if takeable else self.at)[tuple(key) if len(key) > 1 else key[0]] = value
    return self


def _pandas_patches(pandas: ModuleType) -> None:
    for cls in (pandas.DataFrame, pandas.Series):
        for name, function in (("as_matrix", _as_matrix), ("get_value", _get_value), ("set_value", _set_value)):
            if not hasattr(cls, name):
                setattr(cls, name, function)


def _keras_attributes(where: str, names: dict[str, str]) -> Callable[[ModuleType], None]:
    """Set `names` (name -> 'module:attribute', where TensorFlow 2.5 still defines it) on tf.keras's
    `where` module under both of its names: `tf.keras.utils` once tensorflow has imported, and
    `tensorflow.keras.utils` (the import path) when a trainer imports that."""
    def patch(imported: ModuleType) -> None:
        keras = getattr(sys.modules.get("tensorflow"), "keras", None)
        targets = [getattr(keras, where, None), sys.modules.get(f"tensorflow.keras.{where}")]
        for name, source in names.items():
            module, _colon, attribute = source.partition(":")
            value = getattr(importlib.import_module(module), attribute)
            for target in targets:
                if target is not None and not hasattr(target, name):
                    setattr(target, name, value)
    return patch


def _both(*patches: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
    def patch(module: ModuleType) -> None:
        for one in patches:
            one(module)
    return patch


_SCHEDULES = "tensorflow.python.keras.optimizer_v2.learning_rate_schedule"
_KERAS_EXPERIMENTAL = _keras_attributes("experimental", {
    "LinearCosineDecay": f"{_SCHEDULES}:LinearCosineDecay",
    "NoisyLinearCosineDecay": f"{_SCHEDULES}:NoisyLinearCosineDecay",
})
_KERAS_UTILS = _keras_attributes("utils", {"multi_gpu_model": "tensorflow.python.keras.utils.multi_gpu_utils:multi_gpu_model"})

# Each surface: module aliases (old name -> the module that now holds it; a prefix maps its
# submodules too) and patches (module -> a function called once that module is imported).
SURFACES: dict[str, tuple[dict[str, str], dict[str, Callable[[ModuleType], None]]]] = {
    "sklearn-externals": ({"sklearn.externals.joblib": "joblib", "sklearn.externals.six": "six"}, {}),
    "sklearn-paths": (_sklearn_paths(), {}),
    "pandas-1.0": ({}, {"pandas": _pandas_patches}),
    "keras-2.4": ({}, {"tensorflow": _KERAS_UTILS, "tensorflow.keras.utils": _KERAS_UTILS}),
    "keras-2.5": ({}, {"tensorflow": _KERAS_EXPERIMENTAL, "tensorflow.keras.experimental": _KERAS_EXPERIMENTAL}),
}


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        # The import statement returns what sys.modules holds afterwards: the module itself,
        # so classes, pickles and isinstance checks see one module under both names.
        sys.modules[module.__name__] = importlib.import_module(self.target)


class _Patched(importlib.abc.Loader):
    """The module's own loader, then the patch."""

    def __init__(self, loader: Any, patch: Callable[[ModuleType], None]) -> None:
        self.loader, self.patch = loader, patch

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        self.patch(sys.modules.get(module.__name__, module))

    def __getattr__(self, name: str) -> Any:  # resource readers, is_package, get_source
        return getattr(self.loader, name)


class _Aliases(importlib.abc.MetaPathFinder):
    """Last on sys.meta_path: asked only for what no installed release has."""

    def __init__(self, aliases: dict[str, str]) -> None:
        self.aliases = aliases

    def find_spec(self, fullname: str, path: Sequence[str] | None = None, target: Any = None) -> Any:
        for old, new in self.aliases.items():
            if fullname == old or fullname.startswith(old + "."):
                return importlib.util.spec_from_loader(fullname, _Alias(new + fullname[len(old):]))
        return None


class _Patches(importlib.abc.MetaPathFinder):
    """First on sys.meta_path: finds a patched module with the other finders and wraps its loader."""

    def __init__(self, patches: dict[str, Callable[[ModuleType], None]]) -> None:
        self.patches = patches

    def find_spec(self, fullname: str, path: Sequence[str] | None = None, target: Any = None) -> Any:
        if fullname not in self.patches:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Patched(spec.loader, self.patches[fullname])
                return spec
        return None


def install(*surfaces: str, without_tensorflow: str = "") -> None:
    """Called from the image's aiptrain-compat.pth. `without_tensorflow`: the one line an uncaught
    `import tensorflow` ends with, where the runtime holds no TensorFlow (1.x here)."""
    aliases: dict[str, str] = {}
    patches: dict[str, Callable[[ModuleType], None]] = {}
    for name in surfaces:
        aliases.update(SURFACES[name][0])
        for module, patch in SURFACES[name][1].items():
            patches[module] = _both(patches[module], patch) if module in patches else patch
    if patches:
        sys.meta_path.insert(0, _Patches(patches))
    if aliases:
        sys.meta_path.append(_Aliases(aliases))
    if without_tensorflow:
        _one_line_without_tensorflow(without_tensorflow)


def _one_line_without_tensorflow(line: str) -> None:
    """A trainer that imports tensorflow and does not catch the ImportError ends with `line`, not
    a traceback; one that catches it (an optional import) sees the ordinary ModuleNotFoundError."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException, traceback: Any) -> None:
        name = getattr(error, "name", None) or ""
        if isinstance(error, ModuleNotFoundError) and name.split(".")[0] == "tensorflow":
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
            return
        previous(kind, error, traceback)

    sys.excepthook = hook


def check(*surfaces: str) -> list[str]:
    """What the image's build runs: every alias and patch of `surfaces` resolves in the installed
    releases. Returns the names checked."""
    checked = []
    for name in surfaces:
        aliases, patches = SURFACES[name]
        for old in aliases:
            importlib.import_module(old)
            checked.append(old)
        for module_name, patch in patches.items():
            patch(importlib.import_module(module_name))
            checked.append(module_name)
    return checked


if __name__ == "__main__":  # python3 -m aiptrain_compat SURFACE...: the build's check
    names = check(*sys.argv[1:])
    print(f"aiptrain_compat: {len(names)} names of {', '.join(sys.argv[1:])} resolve")
