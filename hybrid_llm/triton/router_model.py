"""router_bls's Triton model class; ``model_repository/router_bls/1/model.py`` only names it."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from typing import Any

from hybrid_llm.contracts import router as router_contract
from hybrid_llm.contracts.spec import InvalidInput
from hybrid_llm.router.config import config_from_parameters, instance_of, instance_share
from hybrid_llm.router.job import build_job, requested_policy
from hybrid_llm.router.metrics import RouterMetrics
from hybrid_llm.router.service import RouterService
from hybrid_llm.router.tokens import prompt_encoder
from hybrid_llm.triton import adapter as ta
from hybrid_llm.triton.transport import TritonTransport


class RouterModel:
    """router_bls: the decoupled BLS router's Triton lifecycle (parameters, tokenizer, metrics,
    the RouterService) and its ``execute``: validate, build the job, admit."""

    def initialize(self, args: dict[str, Any]) -> None:
        """Parse and validate parameters, load the tokenizer, start dispatching."""
        from hybrid_llm.engine.host import use_utf8_locale

        ta.enable_crash_traces()
        use_utf8_locale()
        model_config = json.loads(args["model_config"])
        index, count = instance_of(args.get("model_instance_name", ""), model_config)
        cfg = config_from_parameters(ta.model_parameters(model_config))
        self.cfg = replace(instance_share(cfg, index, count), decoupled=ta.is_decoupled(model_config))
        self.log = ta.Logger("[router]" if count == 1 else f"[router {index}/{count}]")
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.cfg.tokenizer_dir)
        self._tokenize, encoder = prompt_encoder(self.tokenizer)
        self._tokenize_word = lambda word: list(self.tokenizer.encode(word, add_special_tokens=False))
        self.writer = ta.Metrics()
        self.metrics = RouterMetrics(self.writer, model=args["model_name"],
                                     latency_buckets=self.cfg.latency_buckets_s,
                                     tpot_buckets=self.cfg.tpot_buckets_s,
                                     queue_buckets=self.cfg.queue_buckets_s,
                                     instance=None if count == 1 else str(index))
        self.service = RouterService(self.cfg, TritonTransport(self.cfg.decoupled), self.tokenizer, self.metrics,
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
                values = ta.read_request(request, router_contract.INPUTS)
                if values.get("stop"):
                    self._stop(request, sender)
                    continue
                job = build_job(values, self.cfg, self._tokenize, self._tokenize_word)
                if job.stream and not self.cfg.decoupled:
                    raise InvalidInput("Streaming is only supported in decoupled mode. This server renders "
                                       "router_bls unary (decoupled_mode=false): send stream false (ModelInfer, "
                                       "HTTP /infer or /generate), or use a server rendered with "
                                       "decoupled_mode=true to stream")
                parameters = ta.request_parameters(request)
                unknown = sorted(k for k in parameters if k not in router_contract.KNOWN_PARAMETERS
                                 and not k.startswith("triton_"))
                if unknown:
                    raise InvalidInput(f"unknown input(s) or parameter(s) {unknown}; router_bls takes the inputs "
                                       f"{[s.name for s in router_contract.INPUTS]}")
                job.policy = requested_policy(parameters, self.cfg)
            except InvalidInput as exc:
                self.metrics.rejected("invalid")
                ta.send_error(sender, f"router_bls: {exc}", "INVALID_ARG")
                continue
            job.request_id = request.request_id() or uuid.uuid4().hex
            if not self.service.admit(job, sender):
                ta.send_error(sender, f"router_bls: the router queue is full ({self.cfg.max_queue} "
                              "requests waiting); retry later or lower the request rate", "UNAVAILABLE")
        return None

    def _stop(self, request: Any, sender: Any) -> None:
        """A stop request: stop the in-flight request with its id; answer with one empty
        response whose ``backend`` names the engine that request was on ("" when none was in
        flight)."""
        request_id = request.request_id()
        if not request_id:
            raise InvalidInput("a stop request (stop true) names the request to stop by its request id; send it "
                               "with the id of that request (gRPC/ModelInfer 'id')")
        engine = self.service.stop_request(request_id)
        self.metrics.stop_requested("found" if engine else "not_found")
        ta.send(sender, router_contract.pack_response("", self.cfg.model_name(engine) if engine else ""), final=True)

    def finalize(self) -> None:
        """Stop background threads and release metrics."""
        self.service.stop()
        ta.release_bls_streams()
        self.metrics = None
        self.service = None
        self.writer.close()
