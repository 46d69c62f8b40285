"""hybrid_llm: one Triton server, two engines (TensorRT-LLM and vLLM), one router (README: Layout)."""
