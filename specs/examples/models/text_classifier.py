"""A small text classifier for the `text` builtin: token embedding, mean pooling over the real tokens, dense.

    trainer:
      model: {kind: keras, entrypoint: "models.text_classifier:build_model", params: {vocab_size: 1000}}

Token 0 is the text builtin's padding, masked out of the mean, so batches padded to different
lengths give the same prediction for the same sequence.
"""

import keras
from keras import layers


def build_model(vocab_size: int = 32000, num_classes: int = 4, embedding_dim: int = 32, hidden: int = 32,
                learning_rate: float = 0.01) -> keras.Model:
    """A compiled classifier of variable-length token sequences (the text builtin's vocab_size and num_classes)."""
    tokens = keras.Input(shape=(None,), dtype="int32")
    x = layers.Embedding(vocab_size, embedding_dim, mask_zero=True)(tokens)
    x = layers.GlobalAveragePooling1D()(x)
    x = layers.Dense(hidden, activation="relu")(x)
    outputs = layers.Dense(num_classes)(x)
    model = keras.Model(tokens, outputs, name="text_classifier")
    model.compile(optimizer=keras.optimizers.Adam(learning_rate),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model
