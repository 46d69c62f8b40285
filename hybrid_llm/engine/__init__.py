"""Engine hosting inside a Python-backend stub: the vLLM engine loop, its metrics, orphan guard, chunking."""
