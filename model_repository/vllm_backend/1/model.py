"""vllm_backend: vLLM behind Triton's vLLM-backend contract (the code lives in ``hybrid_llm``)."""

from hybrid_llm.triton.vllm_model import VllmModel


class TritonPythonModel(VllmModel):
    """VllmModel: see ``hybrid_llm.triton.vllm_model``."""
