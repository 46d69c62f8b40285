"""vllm_backend: the project's vLLM model (official vLLM backend contract + priority).

Lifecycle only; request parsing and engine plumbing live in ``hybrid_router``.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

from hybrid_router import triton_adapter as ta  # noqa: E402
from hybrid_router.chunking import DeltaMerger  # noqa: E402
from hybrid_router.contracts import VLLM_INPUTS, InvalidInput  # noqa: E402
from hybrid_router.engine_metrics import VllmMetricsSink  # noqa: E402
from hybrid_router.engine_model import EngineModelBase  # noqa: E402
from hybrid_router.sampling import sampling_kwargs_from_json  # noqa: E402


@dataclass
class VllmJob:
    """One parsed vllm_backend request."""

    prompt: str
    sampling: dict[str, Any]
    stream: bool
    exclude_input: bool
    return_finish_reason: bool
    return_num_input_tokens: bool
    return_num_output_tokens: bool
    priority: int
    stop: bool


class TritonPythonModel(EngineModelBase):
    """Decoupled vLLM model: streams text deltas, aborts on cancel, exports vllm:* metrics."""

    log_prefix = "[vllm_backend]"
    merge_tokens = 1  # >1: this model merges streamed deltas (a vLLM without stream_interval)

    def adapt_engine_args(self, engine_args: dict[str, Any]) -> dict[str, Any]:
        """Take ``stream_interval`` out when the installed vLLM lacks it; this model merges deltas then."""
        from hybrid_router.engine_host import engine_arg_names

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

    def parse(self, request: Any) -> VllmJob:
        """Parse and validate one request."""
        v = ta.read_request(request, VLLM_INPUTS)
        priority = 3 if v["priority"] is None else v["priority"]
        if v["stop"]:
            return VllmJob("", {}, False, False, False, False, False, priority, True)
        if not v["text_input"]:
            raise InvalidInput("input 'text_input' is empty; send the prompt text")
        sampling = sampling_kwargs_from_json(v["sampling_parameters"] or "{}")
        return VllmJob(
            prompt=v["text_input"],
            sampling=sampling,
            stream=bool(v["stream"]),
            exclude_input=bool(v["exclude_input_in_output"]),
            return_finish_reason=bool(v["return_finish_reason"]),
            return_num_input_tokens=bool(v["return_num_input_tokens"]),
            return_num_output_tokens=bool(v["return_num_output_tokens"]),
            priority=priority,
            stop=False,
        )

    async def serve(self, job: VllmJob, sender: Any, request_id: str, cancelled: Callable[[], bool]) -> None:
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
                    ta.send(sender, self._outputs(job, text, finish, n_in, n_new), final=out.finished)
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
                ta.send(sender, self._outputs(job, text, finish, n_in, n_out), final=True)
        finally:
            self.sink.request_finished(time.monotonic() - t0)

    def _outputs(self, job: VllmJob, text: str, finish: Any, n_in: int, n_out: int) -> dict[str, np.ndarray]:
        outputs = {"text_output": np.array([text.encode("utf-8")], dtype=np.object_)}
        if job.return_finish_reason:
            outputs["finish_reason"] = np.array([str(finish or "").encode()], dtype=np.object_)
        if job.return_num_input_tokens:
            outputs["num_input_tokens"] = np.array([n_in], dtype=np.uint32)
        if job.return_num_output_tokens:
            outputs["num_output_tokens"] = np.array([n_out], dtype=np.uint32)
        return outputs
