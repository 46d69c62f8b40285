"""trtllm stand-in (cpu and gpu-vllm profiles): the tensorrtllm contract over vLLM (the code lives in ``hybrid_llm``)."""

from hybrid_llm.triton.trtllm_model import TrtllmStandIn


class TritonPythonModel(TrtllmStandIn):
    """TrtllmStandIn: see ``hybrid_llm.triton.trtllm_model``."""
