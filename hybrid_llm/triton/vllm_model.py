"""vllm_backend: the project's vLLM model (Triton's vLLM-backend contract + priority):
a vLLM engine in the stub, text deltas streamed, aborts on cancel or ``stop``."""

from __future__ import annotations

import time
from typing import Any, Callable

from hybrid_llm.triton import adapter as ta
from hybrid_llm.engine.chunking import DeltaMerger
from hybrid_llm.contracts import vllm
from hybrid_llm.contracts.spec import InvalidInput
from hybrid_llm.contracts.vllm import VllmRequest
from hybrid_llm.engine.stats import VllmMetricsSink
from hybrid_llm.triton.engine_model import EngineModelBase


class VllmModel(EngineModelBase):
    """Decoupled vLLM model: streams text deltas, aborts on cancel, exports vllm:* metrics."""

    log_prefix = "[vllm_backend]"
    merge_tokens = 1  # >1: this model merges streamed deltas (a vLLM without stream_interval)

    def adapt_engine_args(self, engine_args: dict[str, Any]) -> dict[str, Any]:
        """Take ``stream_interval`` out when the installed vLLM lacks it; this model merges deltas then."""
        from hybrid_llm.engine.host import engine_arg_names

        if "stream_interval" in engine_args and "stream_interval" not in engine_arg_names():
            value = engine_args.pop("stream_interval")
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"model.json 'stream_interval' = {value!r}: use a whole number of tokens >= 1")
            self.merge_tokens = value
            if value > 1:
                self.log.info(f"this vLLM has no stream_interval; {self.model_name} merges every {value} tokens")
        return engine_args

    def make_sink(self) -> VllmMetricsSink:
        """vllm:* families labelled with this model."""
        return VllmMetricsSink(self.metrics, {"model": self.model_name, "version": self.model_version})

    def parse(self, request: Any) -> VllmRequest:
        """Parse and validate one request."""
        return vllm.unpack(ta.read_request(request, vllm.INPUTS))

    async def serve(self, job: VllmRequest, sender: Any, request_id: str, cancelled: Callable[[], bool]) -> None:
        """Run one request on the engine and stream its responses."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        if job.stop:
            await self.abort(request_id)
            self.sink.request_cancelled()
            ta.send(sender, None)
            return
        try:
            params = SamplingParams(**job.sampling, output_kind=RequestOutputKind.DELTA)
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"input 'sampling_parameters' is invalid: {exc}") from None
        self.sink.request_started()
        t0 = time.monotonic()
        pieces: list[str] = []
        n_out = 0
        n_in = 0
        finish = None
        final_sent = False
        merger = DeltaMerger(self.merge_tokens) if job.stream and self.merge_tokens > 1 else None
        try:
            async for out in self.host.generate(job.prompt, params, request_id, job.priority):
                if cancelled():
                    await self.abort(request_id)
                    self.sink.request_cancelled()
                    ta.send_error(sender, f"{self.model_name}: request cancelled", "CANCELLED")
                    return
                n_in = len(out.prompt_token_ids or [])
                delta = out.outputs[0]
                n_out += len(delta.token_ids)
                finish = delta.finish_reason
                if job.stream:
                    text, n_new = delta.text, len(delta.token_ids)
                    if merger is not None:
                        merged = merger.push(text, n_new, out.finished)
                        if merged is None:
                            continue
                        text, n_new = merged
                    ta.send(sender, vllm.pack_response(job, text, finish, n_in, n_new), final=out.finished)
                    final_sent = out.finished
                else:
                    pieces.append(delta.text)
            if job.stream:
                if not final_sent:
                    ta.send(sender, None)
            else:
                text = "".join(pieces)
                if not job.exclude_input:
                    text = job.prompt + text
                ta.send(sender, vllm.pack_response(job, text, finish, n_in, n_out), final=True)
        finally:
            self.sink.request_finished(time.monotonic() - t0)
