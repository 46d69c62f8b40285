"""The Triton side: the only code importing triton_python_backend_utils (adapter), and the model classes."""
