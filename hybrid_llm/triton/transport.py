"""The router's Transport over Triton: BLS streams to the engine models, responses and
cancellation checks on the client's request (``hybrid_llm.router.service.Transport``)."""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from hybrid_llm.contracts.spec import CANCEL_VIA_STOP
from hybrid_llm.router.relay import EngineError
from hybrid_llm.triton import adapter as ta


class TritonTransport:
    """The router's view of Triton: BLS streams, responses, cancellation.

    ``decoupled`` is router_bls's transaction policy: when false (a unary server), engines
    are called unary and every request gets exactly one response.
    """

    def __init__(self, decoupled: bool = True) -> None:
        self.decoupled = decoupled

    def stream(self, model: str, inputs: Mapping[str, np.ndarray], request_id: str,
               outputs: Sequence[str]) -> Iterator[dict[str, np.ndarray]]:
        """Yield engine responses; engine errors become EngineError."""
        try:
            # The router stops engine requests itself (a ``stop`` request): spare the engine
            # model its per-token cancellation polls.
            yield from ta.bls_stream(model, inputs, request_id, outputs, parameters={CANCEL_VIA_STOP: True},
                                     decoupled=self.decoupled)
        except ta.EngineCallError as exc:
            raise EngineError(str(exc), exc.code) from None

    def send(self, sender: Any, outputs: Mapping[str, np.ndarray] | None, final: bool) -> None:
        """Send a response (or only the FINAL flag; a unary request's one empty response)."""
        if outputs is None and final:
            ta.finish(sender, self.decoupled)
        else:
            ta.send(sender, outputs, final)

    def send_error(self, sender: Any, message: str, code: str) -> None:
        """End a stream with an error."""
        ta.send_error(sender, message, code)

    def is_cancelled(self, sender: Any) -> bool:
        """Client cancelled or disconnected?"""
        return ta.is_cancelled(sender)
