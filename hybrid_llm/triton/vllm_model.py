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
        return VllmMetricsSink(self.metrics, {"model": self.model_name, "version": self.model_version},
                               int(self.engine_args.get("max_model_len") or 4096))

    def parse(self, request: Any) -> VllmRequest:
        """Parse and validate one request."""
        return vllm.unpack(ta.read_request(request, vllm.INPUTS), ta.request_parameters(request))

    def streams(self, job: VllmRequest) -> bool:
        """The ``stream`` input."""
        return bool(job.stream) and not job.stop

    async def serve(self, job: VllmRequest, sender: Any, request_id: str, cancelled: Callable[[], bool]) -> None:
        """Run one request on the engine and stream its responses."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        if job.stop:
            await self.abort(request_id)
            self.sink.request_cancelled()
            self.finish(sender)
            return
        sampling = dict(job.sampling)
        if job.return_cumulative_logprob and sampling.get("logprobs") is None:
            sampling["logprobs"] = 0  # vLLM sums log probs only when it computes them
        try:
            params = SamplingParams(**sampling, output_kind=RequestOutputKind.DELTA)
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"input 'sampling_parameters' is invalid: {exc}") from None
        want_logprobs = job.sampling.get("logprobs") is not None
        self.sink.request_started()
        t0 = time.monotonic()
        n = max(int(params.n or 1), 1)
        total = [vllm.Completion(logprobs=[] if want_logprobs else None) for _ in range(n)]
        n_in = 0
        final_sent = False
        merger = (DeltaMerger(self.merge_tokens) if job.stream and self.merge_tokens > 1 and n == 1
                  and not job.return_logprobs else None)
        try:
            async for out in self.host.generate(job.prompt, params, request_id, job.priority):
                if cancelled():
                    await self.abort(request_id)
                    self.sink.request_cancelled()
                    ta.send_error(sender, f"{self.model_name}: request cancelled", "CANCELLED")
                    return
                n_in = len(out.prompt_token_ids or [])
                step = [vllm.Completion(finish_reason=t.finish_reason, cumulative_logprob=t.cumulative_logprob,
                                        logprobs=[] if want_logprobs else None) for t in total]
                for c in out.outputs:
                    i = min(int(getattr(c, "index", 0)), n - 1)
                    new_lp = _logprob_entries(c.logprobs) if want_logprobs else None
                    for acc in (step[i], total[i]):
                        acc.text += c.text
                        acc.num_output_tokens += len(c.token_ids)
                        acc.finish_reason = c.finish_reason
                        acc.cumulative_logprob = c.cumulative_logprob
                        if new_lp is not None:
                            acc.logprobs.extend(new_lp)
                if job.stream:
                    if merger is not None:
                        merged = merger.push(step[0].text, step[0].num_output_tokens, out.finished)
                        if merged is None:
                            continue
                        step[0].text, step[0].num_output_tokens = merged
                    ta.send(sender, vllm.pack_response(job, step, n_in), final=out.finished)
                    final_sent = out.finished
            if job.stream:
                if not final_sent:
                    self.finish(sender)
            else:
                if not job.exclude_input:
                    for c in total:
                        c.text = job.prompt + c.text
                ta.send(sender, vllm.pack_response(job, total, n_in), final=True)
        finally:
            self.sink.request_finished(time.monotonic() - t0)


def _logprob_entries(logprobs: Any) -> list[dict[str, dict[str, Any]]]:
    """vLLM's per-position log probs as upstream's JSON entries: {token id: {logprob, rank, decoded_token}}."""
    return [{str(tid): {"logprob": float(lp.logprob), "rank": lp.rank, "decoded_token": lp.decoded_token}
             for tid, lp in position.items()} for position in (logprobs or [])]
