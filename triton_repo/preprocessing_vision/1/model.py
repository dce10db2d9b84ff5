"""Stand-in for TensorRT-LLM's ``preprocessing`` model of a multimodal deployment: the
``preprocessing`` stand-in's own code (``../../preprocessing/1/model.py``), which reads
``IMAGE_URL`` because this config names a ``multimodal_model_path``."""

# Shared modules sit at the repository root; no __pycache__ beside the models.
import importlib.util
import os
import sys

sys.dont_write_bytecode = True
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SPEC = importlib.util.spec_from_file_location(
    "preprocessing_standin", os.path.join(_ROOT, "preprocessing", "1", "model.py")
)
assert _SPEC is not None and _SPEC.loader is not None
_MODULE = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_MODULE)

TritonPythonModel = _MODULE.TritonPythonModel
