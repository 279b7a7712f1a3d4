"""dsctl: run TensorFlow's tf.data service for training jobs from YAML specs."""

__version__ = "0.1.0"
