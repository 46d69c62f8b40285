"""router_bls: Triton lifecycle of the hybrid router (the logic lives in ``hybrid_router``)."""

from __future__ import annotations

import json
import os
import sys
import uuid
from typing import Any, Iterator, Mapping, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

from hybrid_router import triton_adapter as ta  # noqa: E402
from hybrid_router.config import config_from_parameters, instance_of, instance_share  # noqa: E402
from hybrid_router.contracts import CANCEL_VIA_STOP, ROUTER_INPUTS, InvalidInput  # noqa: E402
from hybrid_router.metrics import RouterMetrics  # noqa: E402
from hybrid_router.requests import build_job, requested_policy  # noqa: E402
from hybrid_router.service import EngineError, RouterService  # noqa: E402
from hybrid_router.tokens import prompt_encoder  # noqa: E402


class TritonTransport:
    """The router's view of Triton: BLS streams, responses, cancellation."""

    def stream(self, model: str, inputs: Mapping[str, np.ndarray], request_id: str,
               outputs: Sequence[str]) -> Iterator[dict[str, np.ndarray]]:
        """Yield engine responses; engine errors become EngineError."""
        try:
            # The router stops engine requests itself (a ``stop`` request): spare the engine
            # model its per-token cancellation polls.
            yield from ta.bls_stream(model, inputs, request_id, outputs, parameters={CANCEL_VIA_STOP: True})
        except ta.EngineCallError as exc:
            raise EngineError(str(exc), exc.code) from None

    def send(self, sender: Any, outputs: Mapping[str, np.ndarray] | None, final: bool) -> None:
        """Send a response (or only the FINAL flag)."""
        ta.send(sender, outputs, final)

    def send_error(self, sender: Any, message: str, code: str) -> None:
        """End a stream with an error."""
        ta.send_error(sender, message, code)

    def is_cancelled(self, sender: Any) -> bool:
        """Client cancelled or disconnected?"""
        return ta.is_cancelled(sender)


class TritonPythonModel:
    """Decoupled BLS router."""

    def initialize(self, args: dict[str, Any]) -> None:
        """Parse and validate parameters, load the tokenizer, start dispatching."""
        from hybrid_router.engine_host import use_utf8_locale

        ta.enable_crash_traces()
        use_utf8_locale()
        model_config = json.loads(args["model_config"])
        index, count = instance_of(args.get("model_instance_name", ""), model_config)
        self.cfg = instance_share(config_from_parameters(ta.model_parameters(model_config)), index, count)
        self.log = ta.Logger("[router]" if count == 1 else f"[router {index}/{count}]")
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.cfg.tokenizer_dir)
        self._tokenize, encoder = prompt_encoder(self.tokenizer)
        self.writer = ta.Metrics()
        self.metrics = RouterMetrics(self.writer, model=args["model_name"],
                                     latency_buckets=self.cfg.latency_buckets_s,
                                     tpot_buckets=self.cfg.tpot_buckets_s,
                                     queue_buckets=self.cfg.queue_buckets_s,
                                     instance=None if count == 1 else str(index))
        self.service = RouterService(self.cfg, TritonTransport(), self.tokenizer, self.metrics,
                                     log=self.log.info)
        self.service.start()
        self.log.info(f"policy={self.cfg.policy} fallback={self.cfg.fallback_target} "
                      f"targets={self.cfg.trtllm_model},{self.cfg.vllm_model} prompt encoder={encoder} "
                      f"instance {index} of {count} (capacity trtllm={self.cfg.trtllm_capacity} "
                      f"vllm_backend={self.cfg.vllm_capacity}, queue {self.cfg.max_queue})")

    def execute(self, requests: list[Any]) -> None:
        """Validate each request and queue it; responses are sent by the service."""
        self.writer.serving()
        self.service.serving()
        for request in requests:
            sender = request.get_response_sender()
            try:
                values = ta.read_request(request, ROUTER_INPUTS)
                job = build_job(values, self.cfg, self._tokenize)
                job.policy = requested_policy(ta.request_parameters(request), self.cfg)
            except InvalidInput as exc:
                self.metrics.rejected("invalid")
                ta.send_error(sender, f"router_bls: {exc}", "INVALID_ARG")
                continue
            job.request_id = request.request_id() or uuid.uuid4().hex
            if not self.service.admit(job, sender):
                ta.send_error(sender, f"router_bls: the router queue is full ({self.cfg.max_queue} "
                              "requests waiting); retry later or lower the request rate", "UNAVAILABLE")
        return None

    def finalize(self) -> None:
        """Stop background threads and release metrics."""
        self.service.stop()
        ta.release_bls_streams()
        self.metrics = None
        self.service = None
        self.writer.close()
