"""The wire contracts, one module each: ``router`` (router_bls), ``trtllm`` (tensorrtllm),
``vllm`` (Triton's vLLM backend); ``spec`` holds what they share. The names below are
the one request-packing API of the client, the tests and the load tests."""

from hybrid_llm.contracts import router, trtllm, vllm
from hybrid_llm.contracts.router import GenerationRequest, generate_payload
from hybrid_llm.contracts.spec import HIGH, NORMAL, PRIORITY_LABELS, PRIORITY_NAMES, URGENT, InvalidInput, triton_dtype

router_tensors = router.pack
trtllm_tensors = trtllm.pack
vllm_tensors = vllm.pack
vllm_stop_tensors = vllm.stop_tensors
trtllm_stop_tensors = trtllm.stop_tensors

__all__ = [
    "GenerationRequest", "HIGH", "InvalidInput", "NORMAL", "PRIORITY_LABELS", "PRIORITY_NAMES", "URGENT",
    "generate_payload", "router", "router_tensors", "triton_dtype", "trtllm", "trtllm_stop_tensors",
    "trtllm_tensors", "vllm", "vllm_stop_tensors", "vllm_tensors",
]
