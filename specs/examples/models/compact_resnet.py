"""A compact ResNet for the `images` builtin: a stem, a few residual blocks, global pooling, softmax.

    trainer:
      model: {kind: keras, entrypoint: "models.compact_resnet:build_model", params: {crop_size: 32}}

ResNet's shape (residual blocks of two 3x3 convolutions with batch normalisation, a strided
projection where the width doubles) at a width and depth that train on 2 CPU cores: about
50,000 parameters at the defaults, a few milliseconds per 32-image batch of 32x32 crops.
"""

import keras
from keras import layers


def _block(x, width: int, stride: int):
    shortcut = x
    y = layers.Conv2D(width, 3, strides=stride, padding="same", use_bias=False)(x)
    y = layers.BatchNormalization()(y)
    y = layers.ReLU()(y)
    y = layers.Conv2D(width, 3, padding="same", use_bias=False)(y)
    y = layers.BatchNormalization()(y)
    if stride != 1 or shortcut.shape[-1] != width:
        shortcut = layers.Conv2D(width, 1, strides=stride, use_bias=False)(shortcut)
        shortcut = layers.BatchNormalization()(shortcut)
    return layers.ReLU()(layers.Add()([y, shortcut]))


def build_model(crop_size: int = 32, num_classes: int = 10, width: int = 16, blocks_per_stage: int = 1,
                stages: int = 3, learning_rate: float = 0.01) -> keras.Model:
    """A compiled compact ResNet for crop_size x crop_size x 3 images (the images builtin's crop_size)."""
    inputs = keras.Input(shape=(crop_size, crop_size, 3))
    x = layers.Conv2D(width, 3, padding="same", use_bias=False)(inputs)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU()(x)
    for stage in range(stages):
        for block in range(blocks_per_stage):
            x = _block(x, width * 2**stage, 2 if (stage and not block) else 1)
    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(num_classes)(x)
    model = keras.Model(inputs, outputs, name="compact_resnet")
    model.compile(optimizer=keras.optimizers.Adam(learning_rate),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model
