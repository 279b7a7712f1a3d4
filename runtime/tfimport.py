"""Import TensorFlow without its C++ start-up chatter on the user's terminal.

TensorFlow 2.21 writes oneDNN and absl notices straight to file descriptor 2
at import, whatever TF_CPP_MIN_LOG_LEVEL says; in the CLI they would bury the
one-paragraph errors users need to read. Server and trainer processes log to
files and import TensorFlow normally.
"""

from __future__ import annotations

import os
import sys


def import_tensorflow_quietly():
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        import tensorflow
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
    return tensorflow
