"""Example Keras models for `trainer.model: {kind: keras, entrypoint: "models.<module>:build_model"}`.

Small enough to train on 2 CPU cores; each function returns a compiled, built Keras model.
"""
