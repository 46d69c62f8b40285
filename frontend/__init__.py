"""An OpenAI-compatible front door for router_bls: /v1/completions and /v1/chat/completions."""
