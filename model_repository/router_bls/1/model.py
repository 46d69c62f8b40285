"""router_bls: the hybrid router, a decoupled BLS model (the code lives in ``hybrid_llm``)."""

from hybrid_llm.triton.router_model import RouterModel


class TritonPythonModel(RouterModel):
    """router_bls: routes each request to trtllm or vllm_backend and streams the tokens back."""
