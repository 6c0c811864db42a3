"""The TensorFlow algorithms' models, as Keras models from the raw columns (numbers, category
strings) to the outputs: a linear model, a wide and deep model, and TabNet (Arik & Pfister,
"TabNet: Attentive Interpretable Tabular Learning", 2019: feature transformers of GLU blocks, an
attentive transformer choosing features with sparsemax at each decision step).

Each builder returns the model and its variables in groups, one optimizer per group (the wide
and deep model trains its two parts with their own optimizers, as the service's did).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from .flags import Flags
from .preprocess import CATEGORICAL, NUMERICAL, Schema


@dataclass
class Built:
    model: Any  # tf.keras.Model: raw columns -> logits (classification) or the standardized target
    groups: list[tuple[str, list]]  # (optimizer's flag prefix, the layers it trains)


def inputs_of(schema: Schema) -> dict:
    return {column.name: tf.keras.Input(shape=(), dtype=tf.float32 if column.kind == NUMERICAL else tf.string,
                                        name=column.name) for column in schema.features}


def standardized_numbers(schema: Schema, inputs: dict):
    """The numerical columns as one [batch, n] tensor, standardized with the training statistics
    (None when there are none)."""
    numeric = [c for c in schema.features if c.kind == NUMERICAL]
    if not numeric:
        return None
    stacked = tf.stack([inputs[c.name] for c in numeric], axis=1)
    mean = tf.constant([c.mean for c in numeric], tf.float32)
    std = tf.constant([c.std for c in numeric], tf.float32)
    return (stacked - mean) / std


def category_ids(schema: Schema, inputs: dict) -> dict:
    """Each categorical column's values as vocabulary indices (0: a value the training data lacked)."""
    return {c.name: tf.keras.layers.StringLookup(vocabulary=c.vocabulary, num_oov_indices=1, name=f"{c.name}_ids")(
        inputs[c.name]) for c in schema.features if c.kind == CATEGORICAL}


def one_hot(schema: Schema, ids: dict) -> list:
    sizes = {c.name: len(c.vocabulary) + 1 for c in schema.features if c.kind == CATEGORICAL}
    return [tf.one_hot(ids[name], sizes[name]) for name in ids]


def embedded(schema: Schema, ids: dict, dimension=None) -> tuple[list, list]:
    """Each categorical column embedded (`dimension` wide, or the usual 6 * (vocabulary size) ** 0.25):
    the vectors, and the embedding layers that make them."""
    vectors, layers = [], []
    for column in (c for c in schema.features if c.kind == CATEGORICAL):
        size = len(column.vocabulary) + 1
        width = dimension or max(1, min(50, round(6 * size ** 0.25)))
        layers.append(tf.keras.layers.Embedding(size, width, name=f"{column.name}_embedding"))
        vectors.append(layers[-1](ids[column.name]))
    return vectors, layers


def _joined(parts: list):
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else tf.keras.layers.Concatenate()(parts)


def _regularizer(flags: Flags, prefix: str = ""):
    """L1/L2 of the weights as a loss, for the optimizers that do not apply them themselves (ftrl does)."""
    values = flags.values
    if values[f"{prefix}optimizer_type"] == "ftrl":
        return None
    l1, l2 = values[f"{prefix}l1_regularization_strength"], values[f"{prefix}l2_regularization_strength"]
    return tf.keras.regularizers.L1L2(l1, l2) if l1 or l2 else None


def linear(schema: Schema, flags: Flags, outputs: int) -> Built:
    inputs = inputs_of(schema)
    features = _joined([standardized_numbers(schema, inputs), *one_hot(schema, category_ids(schema, inputs))])
    layer = tf.keras.layers.Dense(outputs, kernel_regularizer=_regularizer(flags), name="linear")
    return Built(tf.keras.Model(inputs, layer(features), name="linear_learner"), [("", [layer])])


def wide_deep(schema: Schema, flags: Flags, outputs: int) -> Built:
    """The wide part: a linear model of the categorical columns (--use_wide). The deep part: a
    DNN of the numerical columns and of the categorical ones, embedded (--embed_categories) or
    one-hot where the wide part does not take them."""
    inputs = inputs_of(schema)
    ids = category_ids(schema, inputs)
    numbers = standardized_numbers(schema, inputs)
    use_wide, embed = bool(flags.use_wide), bool(flags.embed_categories)
    wide_layers: list = []
    deep_layers: list = []
    logits = []
    wide_input = _joined(one_hot(schema, ids)) if use_wide and ids else None
    if wide_input is not None:
        wide = tf.keras.layers.Dense(outputs, kernel_regularizer=_regularizer(flags), name="wide")
        wide_layers.append(wide)
        logits.append(wide(wide_input))
    categories, embeddings = embedded(schema, ids) if embed else ([] if use_wide else one_hot(schema, ids), [])
    deep_input = _joined([numbers, *categories])
    if deep_input is not None:
        x = deep_input
        regularizer = _regularizer(flags, "dnn_")
        for index, units in enumerate(flags.hidden_units):
            dense = tf.keras.layers.Dense(units, activation="relu", kernel_regularizer=regularizer,
                                          name=f"hidden_{index}")
            deep_layers.append(dense)
            x = dense(x)
            if flags.dnn_dropout:
                x = tf.keras.layers.Dropout(flags.dnn_dropout)(x)
        head = tf.keras.layers.Dense(outputs, name="deep_logits")
        deep_layers.append(head)
        logits.append(head(x))
    total = logits[0] if len(logits) == 1 else tf.keras.layers.Add()(logits)
    model = tf.keras.Model(inputs, total, name="wide_deep_learner")
    return Built(model, [("", wide_layers), ("dnn_", [*embeddings, *deep_layers])])


# -- TabNet --------------------------------------------------------------------------------------------


def sparsemax(logits):
    """Sparsemax along the last axis (Martins & Astudillo, 2016): a projection onto the simplex
    that sets small weights to exactly zero."""
    logits = logits - tf.reduce_max(logits, axis=-1, keepdims=True)
    depth = logits.shape[-1]
    ordered = tf.sort(logits, axis=-1, direction="DESCENDING")
    cumulative = tf.cumsum(ordered, axis=-1)
    k = tf.range(1, depth + 1, dtype=logits.dtype)
    support = tf.cast(1 + k * ordered > cumulative, logits.dtype)
    size = tf.reduce_sum(support, axis=-1, keepdims=True)
    threshold = (tf.reduce_sum(support * ordered, axis=-1, keepdims=True) - 1) / size
    return tf.maximum(logits - threshold, 0)


class GluBlock(tf.keras.layers.Layer):
    """FC -> batch norm -> GLU, with the residual sqrt(0.5) sum of TabNet's feature transformer."""

    def __init__(self, units: int, momentum: float, residual: bool, dense=None, **kwargs):
        super().__init__(**kwargs)
        self.units, self.residual = units, residual
        self.dense = dense or tf.keras.layers.Dense(2 * units, use_bias=False)
        self.norm = tf.keras.layers.BatchNormalization(momentum=momentum)

    def call(self, x, training=None):
        h = self.norm(self.dense(x), training=training)
        h = h[:, :self.units] * tf.sigmoid(h[:, self.units:])
        return (x + h) * math.sqrt(0.5) if self.residual else h


class TabNetEncoder(tf.keras.layers.Layer):
    """TabNet's encoder: [batch, features] -> [batch, output_dim], adding the masks' entropy
    (weighted by sparsity_loss_weight) as a loss."""

    def __init__(self, features: int, flags: Flags, **kwargs):
        super().__init__(**kwargs)
        self.feature_dim = flags.feature_dim
        self.output_dim = max(1, min(self.feature_dim - 1, round(flags.feature_dim * flags.feature_dim_ratio)))
        self.steps = flags.num_decision_steps
        self.relaxation = flags.relaxation_factor
        self.sparsity_weight = flags.sparsity_loss_weight
        momentum = flags.batch_momentum
        layers = flags.num_transformer_layers
        shared_count = min(layers, round(layers * flags.num_transformer_layers_ratio))
        shared = [tf.keras.layers.Dense(2 * self.feature_dim, use_bias=False, name=f"shared_{i}")
                  for i in range(shared_count)]
        self.input_norm = tf.keras.layers.BatchNormalization(momentum=momentum)
        self.transformers = []
        for step in range(self.steps):
            blocks = [GluBlock(self.feature_dim, momentum, residual=i > 0, dense=dense, name=f"step{step}_shared{i}")
                      for i, dense in enumerate(shared)]
            blocks += [GluBlock(self.feature_dim, momentum, residual=i + shared_count > 0, name=f"step{step}_own{i}")
                       for i in range(layers - shared_count)]
            self.transformers.append(blocks)
        self.attention = [tf.keras.layers.Dense(features, use_bias=False, name=f"attention_{step}")
                          for step in range(self.steps - 1)]
        self.attention_norms = [tf.keras.layers.BatchNormalization(momentum=momentum) for _ in range(self.steps - 1)]

    def call(self, x, training=None):
        features = self.input_norm(x, training=training)
        aggregated = tf.zeros([tf.shape(x)[0], self.output_dim])
        masked = features
        prior = tf.ones_like(features)
        entropy = 0.0
        for step in range(self.steps):
            h = masked
            for block in self.transformers[step]:
                h = block(h, training=training)
            if step > 0:
                aggregated += tf.nn.relu(h[:, :self.output_dim])
            if step < self.steps - 1:
                coefficients = self.attention_norms[step](self.attention[step](h[:, self.output_dim:]),
                                                          training=training)
                mask = sparsemax(coefficients * prior)
                prior *= self.relaxation - mask
                entropy += tf.reduce_mean(tf.reduce_sum(-mask * tf.math.log(mask + 1e-10), axis=1)) / (self.steps - 1)
                masked = mask * features
        self.add_loss(self.sparsity_weight * entropy)
        return aggregated


def tab_net(schema: Schema, flags: Flags, outputs: int) -> Built:
    """TabNet on the standardized numerical columns and a one-wide embedding of each categorical one."""
    inputs = inputs_of(schema)
    categories, _ = embedded(schema, category_ids(schema, inputs), 1)
    features = _joined([standardized_numbers(schema, inputs), *categories])
    width = features.shape[-1]
    encoded = TabNetEncoder(width, flags, name="tabnet")(features)
    head = tf.keras.layers.Dense(outputs, name="output")(encoded)
    model = tf.keras.Model(inputs, head, name="tab_net")
    return Built(model, [("", [model])])


BUILDERS = {"linear_learner": linear, "wide_deep_learner": wide_deep, "tab_net": tab_net}
